#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "ptrain/core/error.h"
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

// Every byte of a checkpoint is covered: a flip anywhere is either refused naming the file (most often as a
// checksum mismatch) or, where it lands in the header's padding, changes nothing that is loaded.
TEST(Checkpoint, EveryFlippedByteIsDetectedOrHarmless) {
  ptrain::testing::TempDir tmp;
  const fs::path dir = tmp.path();
  const auto path = (dir / "step.safetensors").string();
  ptrain::train::save_checkpoint(path, sample());
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const Checkpoint good = ptrain::train::load_checkpoint(path);
  int detected = 0, harmless = 0;
  for (size_t at = 0; at < bytes.size(); at += 7) {
    std::string flipped = bytes;
    flipped[at] = static_cast<char>(flipped[at] ^ (1 << (at % 8)));
    std::ofstream(path, std::ios::binary | std::ios::trunc) << flipped;
    try {
      const Checkpoint loaded = ptrain::train::load_checkpoint(path);
      ASSERT_EQ(loaded.model.size(), good.model.size()) << "byte " << at;
      for (size_t i = 0; i < good.model.size(); ++i)
        ASSERT_TRUE(torch::equal(loaded.model[i].second, good.model[i].second)) << "byte " << at << " changed a tensor unnoticed";
      ASSERT_TRUE(torch::equal(loaded.optimizer[0].second, good.optimizer[0].second)) << "byte " << at;
      ASSERT_EQ(loaded.position.global_step, good.position.global_step) << "byte " << at;
      ++harmless;
    } catch (const ptrain::Error& e) {
      ASSERT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      ++detected;
    }
  }
  EXPECT_GT(detected, 0);
  // The tensors' data alone is about half the file: most flips must have been caught.
  EXPECT_GT(detected, 10 * harmless);
}

TEST(Checkpoint, AFlippedTensorBitIsAChecksumMismatch) {
  ptrain::testing::TempDir tmp;
  const auto path = tmp.file("step.safetensors");
  ptrain::train::save_checkpoint(path, sample());
  std::fstream file(path, std::ios::binary | std::ios::in | std::ios::out);
  file.seekp(-3, std::ios::end);  // inside the last tensor's bytes: a well-formed file still
  file.put('\x7f');
  file.close();
  const std::string message = error_of([&] { ptrain::train::load_checkpoint(path); });
  EXPECT_NE(message.find(path + ": checksum mismatch"), std::string::npos) << message;
}

TEST(Checkpoint, CheckpointsOfTheFirstFormatWithoutChecksumStillLoad) {
  ptrain::testing::TempDir tmp;
  const auto path = tmp.file("old.safetensors");
  ptrain::io::write_safetensors(path, {{"model/fc.weight", torch::ones({2, 2})}},
                                {{"format", "ptrain-checkpoint"}, {"format_version", "1"}, {"epoch", "1"},
                                 {"micro_batch", "0"}, {"global_step", "5"}, {"world_size", "1"},
                                 {"batch_size", "8"}, {"run", "{}"}});
  EXPECT_EQ(ptrain::train::load_checkpoint(path).position.global_step, 5);
}

TEST(Checkpoint, AStepNumberBeyondInt64IsRefusedByName) {
  ptrain::testing::TempDir tmp;
  ptrain::train::save_checkpoint(ptrain::train::checkpoint_path(tmp.path(), 3), sample());
  const auto absurd = tmp.file("step-99999999999999999999999.safetensors");
  std::ofstream(absurd) << "x";
  const std::string message = error_of([&] { ptrain::train::latest_checkpoint(tmp.path()); });
  EXPECT_NE(message.find(absurd), std::string::npos) << message;
  EXPECT_NE(message.find("out of range"), std::string::npos) << message;
}

TEST(Checkpoint, StaleTemporariesOfKilledWritesAreRemovedAndNothingElse) {
  ptrain::testing::TempDir tmp;
  const auto keep = ptrain::train::checkpoint_path(tmp.path(), 4);
  ptrain::train::save_checkpoint(keep, sample());
  for (const char* name : {"step-00000008.safetensors.tmp.Ab12Cd", "step-00000008.rank-00001.safetensors.tmp.x9Y8z7"})
    std::ofstream(tmp.file(name)) << "partial";
  std::ofstream(tmp.file("notes.tmp.Ab12Cd")) << "mine";
  EXPECT_EQ(ptrain::train::remove_stale_temporaries(tmp.path()), 2);
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(tmp.path())) left.push_back(entry.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"notes.tmp.Ab12Cd", "step-00000004.safetensors"}));
}

TEST(Checkpoint, RetentionKeepsTheNewestAndTheOneResumedFrom) {
  ptrain::testing::TempDir tmp;
  const auto at = [&](int64_t step) { return ptrain::train::checkpoint_path(tmp.path(), step); };
  for (int64_t step : {1, 2, 3, 4, 5}) ptrain::train::save_checkpoint(at(step), sample());
  std::ofstream(ptrain::train::shard_path(at(1), 0)) << "shard";
  std::ofstream(ptrain::train::shard_path(at(1), 1)) << "shard";
  const auto removed = ptrain::train::prune_checkpoints(tmp.path(), 2, at(2));
  EXPECT_EQ(removed, (std::vector<std::string>{at(1), at(3)}));
  for (int64_t step : {2, 4, 5}) EXPECT_TRUE(fs::exists(at(step))) << step;
  EXPECT_FALSE(fs::exists(ptrain::train::shard_path(at(1), 0)));
  EXPECT_FALSE(fs::exists(ptrain::train::shard_path(at(1), 1)));
  EXPECT_TRUE(ptrain::train::prune_checkpoints(tmp.path(), 0, "").empty());  // 0: keep all
}

}  // namespace
