// End-to-end: a run resumed from a mid-epoch checkpoint ends exactly where the uninterrupted run ends.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "ptrain/train/checkpoint.h"
#include "ptrain/train/plan.h"
#include "ptrain/train/trainer.h"
#include "test_support.h"

namespace {

ptrain::config::TrainConfig small_run(const std::string& checkpoint_dir) {
  ptrain::config::TrainConfig c;
  c.model.name = "resnet20";
  c.data.dataset = "synthetic";
  c.data.path = "96:3x16x16:4";
  c.run.batch_size = 8;
  c.run.epochs = 2;
  c.run.device = "cpu";
  c.run.seed = 11;
  c.run.progress = "none";
  c.run.checkpoint_dir = checkpoint_dir;
  c.run.checkpoint_every = 5;
  c.data.test_limit = 16;
  c.optim.lr = 0.05;
  return c;
}

std::map<std::string, torch::Tensor> model_of(const std::string& path) {
  std::map<std::string, torch::Tensor> out;
  for (auto& [name, t] : ptrain::train::load_checkpoint(path).model) out[name] = t;
  return out;
}

void resumed_equals_uninterrupted(ptrain::config::TrainConfig config, int64_t resume_step) {
  ptrain::testing::TempDir tmp;
  const std::filesystem::path dir = tmp.path();
  config.run.checkpoint_dir = (dir / "full").string();
  const auto full = ptrain::train::train(ptrain::train::make_plan(config), "test");
  const int64_t total = full.steps;
  ASSERT_GT(total, resume_step);

  auto resumed_config = config;
  resumed_config.run.checkpoint_dir = (dir / "resumed").string();
  resumed_config.run.resume = ptrain::train::checkpoint_path(config.run.checkpoint_dir, resume_step);
  const auto resumed = ptrain::train::train(ptrain::train::make_plan(resumed_config), "test");
  EXPECT_EQ(resumed.steps, total);

  const auto want = model_of(ptrain::train::checkpoint_path(config.run.checkpoint_dir, total));
  const auto got = model_of(ptrain::train::checkpoint_path(resumed_config.run.checkpoint_dir, total));
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [name, tensor] : want) {
    EXPECT_TRUE(torch::equal(got.at(name), tensor)) << name << " differs after resume";
  }
  ASSERT_TRUE(full.final_test_accuracy.has_value());
  EXPECT_DOUBLE_EQ(*resumed.final_test_accuracy, *full.final_test_accuracy);
}

TEST(Resume, MidEpochSgdFp32) {
  auto c = small_run("");
  resumed_equals_uninterrupted(c, 5);  // 12 steps an epoch: step 5 is mid-epoch
}

TEST(Resume, MidEpochAdamWBf16MasterWeightsAccumulationClipping) {
  auto c = small_run("");
  c.optim.name = "adamw";
  c.optim.lr = 1e-3;
  c.optim.grad_accum = 2;
  c.optim.clip_grad_norm = 1.0;
  c.precision.precision = "bf16";
  c.precision.master_weights = true;
  resumed_equals_uninterrupted(c, 5);  // 6 steps an epoch: step 5 is in the first epoch, 10 in the second
}

TEST(Resume, ResumingFromTheEndOfAnEpoch) {
  auto c = small_run("");
  c.run.checkpoint_every = 0;
  resumed_equals_uninterrupted(c, 12);  // the epoch-end checkpoint
}

}  // namespace
