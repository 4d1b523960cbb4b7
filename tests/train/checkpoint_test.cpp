#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "ptrain/io/safetensors.h"
#include "ptrain/train/checkpoint.h"
#include "test_support.h"

namespace {

namespace fs = std::filesystem;
using ptrain::train::Checkpoint;

Checkpoint sample() {
  Checkpoint c;
  c.position = {2, 14, 230, 3, 64};
  c.model = {{"conv1.weight", torch::randn({4, 3, 3, 3})}, {"bn1.num_batches_tracked", torch::tensor(7, torch::kLong)}};
  c.optimizer = {{"conv1.weight.momentum_buffer", torch::randn({4, 3, 3, 3})}};
  c.scaler = {{"scale", torch::tensor(1024.0)}};
  c.progress = {{"loss_sum", torch::tensor(12.5, torch::kDouble)}};
  c.run = {{"model", {{"name", "resnet18"}}}};
  return c;
}

std::string error_of(const std::function<void()>& f) { return ptrain::testing::error_message<std::exception>(f); }

TEST(Checkpoint, RoundTripsEverySection) {
  ptrain::testing::TempDir tmp;
  const fs::path dir = tmp.path();
  const auto path = ptrain::train::checkpoint_path(dir.string(), 230);
  const Checkpoint saved = sample();
  ptrain::train::save_checkpoint(path, saved);
  const Checkpoint loaded = ptrain::train::load_checkpoint(path);
  EXPECT_EQ(loaded.position.epoch, 2);
  EXPECT_EQ(loaded.position.micro_batch, 14);
  EXPECT_EQ(loaded.position.global_step, 230);
  EXPECT_EQ(loaded.position.world_size, 3);
  EXPECT_EQ(loaded.position.batch_size, 64);
  ASSERT_EQ(loaded.model.size(), 2u);
  EXPECT_TRUE(torch::equal(loaded.model[0].second, saved.model[0].second));
  EXPECT_EQ(loaded.model[1].second.item<int64_t>(), 7);
  EXPECT_TRUE(torch::equal(loaded.optimizer[0].second, saved.optimizer[0].second));
  EXPECT_EQ(loaded.scaler[0].second.item<double>(), 1024.0);
  EXPECT_EQ(loaded.run["model"]["name"], "resnet18");
  EXPECT_EQ(ptrain::train::latest_checkpoint(dir.string()), path);
}

TEST(Checkpoint, LatestPicksTheHighestStep) {
  ptrain::testing::TempDir tmp;
  const fs::path dir = tmp.path();
  for (int64_t step : {9, 100, 20}) ptrain::train::save_checkpoint(ptrain::train::checkpoint_path(dir.string(), step), sample());
  EXPECT_EQ(ptrain::train::latest_checkpoint(dir.string()), ptrain::train::checkpoint_path(dir.string(), 100));
  EXPECT_EQ(ptrain::train::latest_checkpoint((dir / "missing").string()), "");
}

TEST(Checkpoint, TruncatedFileIsRefusedByName) {
  ptrain::testing::TempDir tmp;
  const fs::path dir = tmp.path();
  const auto path = (dir / "step.safetensors").string();
  ptrain::train::save_checkpoint(path, sample());
  fs::resize_file(path, fs::file_size(path) / 2);
  const std::string message = error_of([&] { ptrain::train::load_checkpoint(path); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
}

TEST(Checkpoint, WeightsFileIsNotTakenForACheckpoint) {
  ptrain::testing::TempDir tmp;
  const fs::path dir = tmp.path();
  const auto path = (dir / "weights.safetensors").string();
  ptrain::io::write_safetensors(path, {{"fc.weight", torch::randn({2, 2})}});
  const std::string message = error_of([&] { ptrain::train::load_checkpoint(path); });
  EXPECT_NE(message.find("not a ptrain checkpoint"), std::string::npos) << message;
}

TEST(Checkpoint, FailedWriteKeepsThePreviousCheckpoint) {
  ptrain::testing::TempDir tmp;
  const fs::path dir = tmp.path();
  const auto path = (dir / "step.safetensors").string();
  ptrain::train::save_checkpoint(path, sample());
  const auto size = fs::file_size(path);
  Checkpoint bad = sample();
  bad.model.emplace_back("bad", torch::randn({2}, torch::kComplexFloat));  // no safetensors dtype: the write fails
  EXPECT_THROW(ptrain::train::save_checkpoint(path, bad), std::exception);
  EXPECT_EQ(fs::file_size(path), size);
  EXPECT_NO_THROW(ptrain::train::load_checkpoint(path));
  for (const auto& entry : fs::directory_iterator(dir)) EXPECT_EQ(entry.path().string(), path) << "left behind";
}

}  // namespace
