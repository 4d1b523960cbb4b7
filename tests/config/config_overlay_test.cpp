#include "ptrain/config/config_overlay.h"

#include <gtest/gtest.h>

#include "ptrain/core/error.h"
#include "test_support.h"

namespace {

using ptrain::config::ConfigOverlay;
using ptrain::config::TrainConfig;

// The merge alone, on an overlay written by hand: the file's values land where no flag was given, a given
// flag keeps its value and names the file's key it replaces, a default of the format is replaced silently.
TEST(ConfigOverlay, FlagsWinAndEachReplacedValueOfTheFileIsNamed) {
  ConfigOverlay o;
  o.source = "ds.json";
  o.lr = {0.01, "optimizer.params.lr"};
  o.momentum = {0.5, "optimizer.params.momentum"};
  o.weight_decay = {0.0, "optimizer.params.weight_decay", /*named_by_file=*/false};
  o.strategy = {"zero2", "zero_optimization.stage"};
  o.warmup_steps = {50, "scheduler.params.warmup_num_steps"};
  TrainConfig c;
  c.optim.lr = 0.5;
  c.optim.weight_decay = 0.25;
  const auto warnings = ptrain::config::apply_overlay(o, c, {"lr", "weight-decay"}, /*world_size=*/1);
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.5);
  EXPECT_DOUBLE_EQ(c.optim.weight_decay, 0.25);
  EXPECT_DOUBLE_EQ(c.optim.momentum, 0.5);
  EXPECT_EQ(c.run.strategy, "zero2");
  EXPECT_EQ(c.optim.warmup_steps, 50);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "ds.json: key 'optimizer.params.lr' (0.01) is overridden by --lr 0.5 from the command line, "
                         "PTRAIN_* or --config");
}

// A value the file may write but the flag refuses is refused by both names, as the flag's own check says it.
TEST(ConfigOverlay, ValuesOutsideTheFlagsRangeAreRefusedNamingKeyAndFlag) {
  ConfigOverlay o;
  o.source = "ds.json";
  o.momentum = {1.5, "optimizer.params.momentum"};
  TrainConfig c;
  const std::string message =
      ptrain::testing::error_message<ptrain::Error>([&] { ptrain::config::apply_overlay(o, c, {}, 1); });
  EXPECT_EQ(message, "ds.json: key 'optimizer.params.momentum': --momentum: must be between 0 and 1, not 1.5");
  EXPECT_DOUBLE_EQ(c.optim.momentum, TrainConfig{}.optim.momentum);

  ConfigOverlay zero_lr;
  zero_lr.source = "ds.json";
  zero_lr.lr = {0.0, "scheduler.params.warmup_max_lr"};
  EXPECT_NE(ptrain::testing::error_message<ptrain::Error>([&] { ptrain::config::apply_overlay(zero_lr, c, {}, 1); })
                .find("'scheduler.params.warmup_max_lr': --lr: must be greater than 0"),
            std::string::npos);
}

// A DeepSpeed file's float settings meet the flags' float bound: fp16.initial_scale_power 200 is 2^200.
TEST(ConfigOverlay, FloatSettingsBeyondAFloatAreRefusedNamingKeyAndFlag) {
  ConfigOverlay o;
  o.source = "ds.json";
  o.initial_loss_scale = {1.6e60, "fp16.initial_scale_power"};
  TrainConfig c;
  EXPECT_EQ(ptrain::testing::error_message<ptrain::Error>([&] { ptrain::config::apply_overlay(o, c, {}, 1); }),
            "ds.json: key 'fp16.initial_scale_power': --initial-loss-scale: must be at most 3.40282e+38 (the largest "
            "float), not 1.6e+60");
  ConfigOverlay lr;
  lr.source = "ds.json";
  lr.lr = {1e39, "optimizer.params.lr"};
  EXPECT_NE(ptrain::testing::error_message<ptrain::Error>([&] { ptrain::config::apply_overlay(lr, c, {}, 1); })
                .find("'optimizer.params.lr': --lr: must be at most 3.40282e+38 (the largest float), not 1e+39"),
            std::string::npos);
}

// The batch keys resolve after the flags are folded in: "auto" takes --batch-size, and train_batch_size
// gives the accumulation over the world.
TEST(ConfigOverlay, BatchKeysResolveWithTheFlagsAndTheWorldSize) {
  ConfigOverlay o;
  o.source = "ds.json";
  o.batch.any = true;
  o.batch.train_batch.value = 96;
  o.batch.micro_auto = true;
  TrainConfig c;
  c.run.batch_size = 16;
  ptrain::config::apply_overlay(o, c, {"batch-size"}, /*world_size=*/3);
  EXPECT_EQ(c.run.batch_size, 16);
  EXPECT_EQ(c.optim.grad_accum, 2);  // 96 / (16 x 3)

  ConfigOverlay bad = o;
  bad.batch.train_batch.value = 100;
  TrainConfig d;
  d.run.batch_size = 16;
  const std::string message =
      ptrain::testing::error_message<ptrain::Error>([&] { ptrain::config::apply_overlay(bad, d, {"batch-size"}, 3); });
  EXPECT_EQ(message.rfind("ds.json: ", 0), 0u) << message;
  EXPECT_NE(message.find("not divisible"), std::string::npos) << message;
}

}  // namespace
