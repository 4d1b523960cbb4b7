#include "ptrain/train/plan.h"

#include <gtest/gtest.h>

#include "ptrain/core/error.h"
#include "test_support.h"  // tests/io

namespace {

ptrain::config::TrainConfig cpu_config() {
  ptrain::config::TrainConfig c;
  c.run.device = "cpu";
  return c;
}

std::string plan_error(const ptrain::config::TrainConfig& c) {
  return ptrain::testing::error_message<ptrain::Error>([&] { ptrain::train::make_plan(c); });
}

TEST(Plan, LossScalerRulesNeedADynamicScale) {
  auto c = cpu_config();
  c.precision.hysteresis = 2;  // fp32 has no loss scaling
  const std::string message = plan_error(c);
  EXPECT_NE(message.find("--hysteresis"), std::string::npos) << message;
  EXPECT_NE(message.find("fp32"), std::string::npos) << message;

  const auto plain = ptrain::train::make_plan(cpu_config());  // the defaults are GradScaler's and pass
  EXPECT_EQ(plain.precision.hysteresis, 1);
  EXPECT_EQ(plain.precision.loss_scale_window, 2000);
}

TEST(Plan, WarmupInStepsAndInEpochsExcludeEachOther) {
  auto c = cpu_config();
  c.optim.warmup_steps = 10;
  c.optim.warmup_epochs = 1;
  EXPECT_NE(plan_error(c).find("--warmup-steps"), std::string::npos);
}

TEST(Plan, FsdpIsRefusedWithTheZeroStagesThatShardAlike) {
  auto c = cpu_config();
  c.run.strategy = "fsdp";  // what accelerate's FSDP config asks for
  const std::string message = plan_error(c);
  EXPECT_NE(message.find("--strategy fsdp"), std::string::npos) << message;
  EXPECT_NE(message.find("zero3"), std::string::npos) << message;
}

}  // namespace
