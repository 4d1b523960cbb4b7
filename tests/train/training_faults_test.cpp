// Training runs that stop, resume and diverge: nothing lost, nothing silent.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "../dist/multiprocess.h"
#include "ptrain/core/error.h"
#include "ptrain/train/checkpoint.h"
#include "ptrain/train/plan.h"
#include "ptrain/train/trainer.h"
#include "test_support.h"

namespace {

namespace fs = std::filesystem;

// 8 steps an epoch of 8 samples (64 of 4 classes, 8x8 images): a few seconds on one thread.
ptrain::config::TrainConfig tiny_run(const std::string& checkpoint_dir) {
  ptrain::config::TrainConfig c;
  c.model.name = "resnet20";
  c.data.dataset = "synthetic";
  c.data.path = "64:3x8x8:4";
  c.data.test_limit = 16;
  c.run.batch_size = 8;
  c.run.epochs = 2;
  c.run.device = "cpu";
  c.run.threads = 1;
  c.run.seed = 3;
  c.run.progress = "none";
  c.run.log_every = 2;
  c.run.checkpoint_dir = checkpoint_dir;
  c.optim.lr = 0.05;
  c.optim.schedule = "constant";
  return c;
}

ptrain::metrics::RunRecord train(const ptrain::config::TrainConfig& c) {
  return ptrain::train::train(ptrain::train::make_plan(c), "test");
}

std::map<std::string, torch::Tensor> model_of(const std::string& path) {
  std::map<std::string, torch::Tensor> out;
  for (auto& [name, t] : ptrain::train::load_checkpoint(path).model) out[name] = t;
  return out;
}

void expect_same_model(const std::string& a, const std::string& b) {
  const auto want = model_of(a), got = model_of(b);
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [name, tensor] : want) EXPECT_TRUE(torch::equal(got.at(name), tensor)) << name;
}

// A run stopped by --max-steps inside an epoch saves where it stopped: resumed, it finishes that epoch and
// ends where the run that was never stopped ends, weights and all.
TEST(TrainingFaults, ResumeAfterAMaxStepsStopContinuesTheEpoch) {
  ptrain::testing::TempDir tmp;
  auto whole = tiny_run(tmp.file("whole"));
  const auto uninterrupted = train(whole);
  ASSERT_EQ(uninterrupted.steps, 16);

  auto stopped = tiny_run(tmp.file("stopped"));
  stopped.run.max_steps = 5;
  EXPECT_EQ(train(stopped).steps, 5);
  const auto position = ptrain::train::load_checkpoint(ptrain::train::latest_checkpoint(stopped.run.checkpoint_dir)).position;
  EXPECT_EQ(position.epoch, 0);
  EXPECT_EQ(position.micro_batch, 5);

  auto resumed = stopped;
  resumed.run.max_steps = 0;
  resumed.run.resume = "latest";
  const auto record = train(resumed);
  EXPECT_EQ(record.steps, 16);
  expect_same_model(ptrain::train::checkpoint_path(whole.run.checkpoint_dir, 16),
                    ptrain::train::checkpoint_path(stopped.run.checkpoint_dir, 16));
  ASSERT_EQ(record.epochs_detail.size(), 2u);  // the rest of epoch 1, then epoch 2
  EXPECT_DOUBLE_EQ(*record.epochs_detail[0].train_accuracy, *uninterrupted.epochs_detail[0].train_accuracy);
  EXPECT_DOUBLE_EQ(record.epochs_detail[0].train_loss, uninterrupted.epochs_detail[0].train_loss);
}

// A learning rate of 1e6 makes the loss NaN within a few steps: the run stops with an error naming the
// step, and every checkpoint it left holds finite weights.
TEST(TrainingFaults, DivergenceStopsTheRunNamingTheStepAndSavesNothingNonFinite) {
  ptrain::testing::TempDir tmp;
  auto c = tiny_run(tmp.path());
  c.optim.lr = 1e6;
  c.run.checkpoint_every = 1;
  c.run.log_every = 4;
  std::string message;
  try {
    train(c);
  } catch (const ptrain::Error& e) {
    message = e.what();
  }
  ASSERT_NE(message.find("training diverged at step "), std::string::npos) << message;
  EXPECT_NE(message.find("--on-divergence warn"), std::string::npos) << message;
  int checkpoints = 0;
  for (const auto& path : ptrain::train::list_checkpoints(tmp.path())) {
    for (const auto& [name, tensor] : ptrain::train::load_checkpoint(path).model) {
      if (tensor.is_floating_point()) ASSERT_TRUE(torch::isfinite(tensor).all().item<bool>()) << path << " " << name;
    }
    ++checkpoints;
  }
  EXPECT_LT(checkpoints, 4) << "the run must stop within the log window it diverged in";
}

TEST(TrainingFaults, DivergenceWarnTrainsOnRecordsTheStepAndSavesNoNonFiniteCheckpoint) {
  ptrain::testing::TempDir tmp;
  auto c = tiny_run(tmp.path());
  c.optim.lr = 1e6;
  c.run.epochs = 1;
  c.run.on_divergence = "warn";
  const auto record = train(c);
  EXPECT_EQ(record.steps, 8);
  ASSERT_TRUE(record.diverged_at_step.has_value());
  EXPECT_LE(*record.diverged_at_step, 8);
  EXPECT_EQ(ptrain::train::latest_checkpoint(tmp.path()), "") << "the epoch's end held NaN weights";
}

// Two processes under ddp stop mid-epoch and resume: the resumed epoch's train loss and accuracy are the
// uninterrupted run's, not rank 0's running sums counted on every rank.
TEST(TrainingFaults, MultiProcessResumeRestoresTheEpochsRunningTotals) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const std::string dir = ptrain::testing::temp_dir("totals");
  const auto run_two = [&](const std::string& name, int64_t checkpoint_every, const std::string& resume) {
    const int port = ptrain::testing::free_port();
    const auto outcomes = ptrain::testing::run_world(2, [&](int rank) {
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", "2", 1);
      ::setenv("LOCAL_WORLD_SIZE", "2", 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      auto c = tiny_run(dir + "/" + name);
      c.run.strategy = "ddp";
      c.run.epochs = 1;
      c.run.checkpoint_every = checkpoint_every;
      c.run.resume = resume;
      c.dist.timeout_seconds = 60;
      const auto record = train(c);
      if (rank == 0) std::ofstream(dir + "/" + name + ".json") << nlohmann::json{{"loss", record.epochs_detail.back().train_loss},
                                                                            {"accuracy", *record.epochs_detail.back().train_accuracy}};
    }, 120);
    for (const auto& o : outcomes) ASSERT_EQ(o.exit_code, 0) << o.message;
  };
  run_two("whole", 2, "");  // 4 steps of 2 x 8 samples; checkpoints at steps 2 and 4
  run_two("resumed", 0, dir + "/whole/step-00000002.safetensors");
  const auto whole = nlohmann::json::parse(std::ifstream(dir + "/whole.json"));
  const auto resumed = nlohmann::json::parse(std::ifstream(dir + "/resumed.json"));
  EXPECT_NEAR(resumed["loss"].get<double>(), whole["loss"].get<double>(), 1e-9 * std::fabs(whole["loss"].get<double>()));
  EXPECT_DOUBLE_EQ(resumed["accuracy"].get<double>(), whole["accuracy"].get<double>());
  ptrain::testing::remove_tree(dir);
}

}  // namespace
