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

// 2 MiB of tensors: written with parts of at least kPartBytes, a checkpoint of kMaxCheckpointParts parts.
constexpr int64_t kPartBytes = int64_t{128} << 10;
Checkpoint large_sample() {
  Checkpoint c = sample();
  for (int i = 0; i < 16; ++i) {
    const std::string name = "layer" + std::to_string(i) + ".weight";
    c.model.emplace_back(name, torch::randn({128, 128}));
    c.optimizer.emplace_back(name + ".momentum_buffer", torch::randn({128, 128}));
  }
  return c;
}

void save_in_parts(const std::string& path, const Checkpoint& c, const std::function<void()>& before_rename = {}) {
  ptrain::train::save_checkpoint(path, c, {before_rename, {}, kPartBytes});
}

std::vector<std::string> sorted_names(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> part_files(const fs::path& dir) {
  std::vector<std::string> parts;
  for (const auto& name : sorted_names(dir))
    if (ptrain::train::named_as_part(name)) parts.push_back((dir / name).string());
  return parts;
}

void expect_same_tensors(const ptrain::io::NamedTensors& got, const ptrain::io::NamedTensors& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_TRUE(torch::equal(got[i].second, want[i].second)) << want[i].first;
  }
}

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

TEST(Checkpoint, ALargeCheckpointNamesItsPartFilesAndLoadsWhole) {
  ptrain::testing::TempDir tmp;
  const auto path = ptrain::train::checkpoint_path(tmp.path(), 230);
  const Checkpoint saved = large_sample();
  save_in_parts(path, saved);
  const auto parts = part_files(tmp.path());
  ASSERT_EQ(static_cast<int64_t>(parts.size()), ptrain::train::kMaxCheckpointParts);
  EXPECT_TRUE(ptrain::io::read_safetensors(path).empty()) << "the checkpoint file holds the parts' tensors too";
  size_t in_parts = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto part = ptrain::train::load_part(parts[i]);
    EXPECT_EQ(part.part, static_cast<int64_t>(i)) << parts[i];
    EXPECT_EQ(part.parts, ptrain::train::kMaxCheckpointParts) << parts[i];
    EXPECT_FALSE(part.tensors.empty()) << parts[i];
    in_parts += part.tensors.size();
  }
  EXPECT_EQ(in_parts, saved.model.size() + saved.optimizer.size() + saved.scaler.size() + saved.progress.size());

  const Checkpoint loaded = ptrain::train::load_checkpoint(path);
  EXPECT_EQ(loaded.parts, ptrain::train::kMaxCheckpointParts);
  EXPECT_EQ(loaded.position.global_step, 230);
  expect_same_tensors(loaded.model, saved.model);
  expect_same_tensors(loaded.optimizer, saved.optimizer);
  expect_same_tensors(loaded.scaler, saved.scaler);
  expect_same_tensors(loaded.progress, saved.progress);
  EXPECT_EQ(ptrain::train::list_checkpoints(tmp.path()), std::vector<std::string>{path});

  // Under two parts' worth of bytes: one file, as ever.
  const auto small = ptrain::train::checkpoint_path(tmp.path(), 231);
  save_in_parts(small, sample());
  EXPECT_EQ(ptrain::train::load_checkpoint(small).parts, 0);
  EXPECT_EQ(part_files(tmp.path()).size(), parts.size());
}

TEST(Checkpoint, AMissingPartOrAPartOfAnotherWriteIsRefusedByName) {
  ptrain::testing::TempDir tmp;
  const fs::path here = fs::path(tmp.path()) / "here", there = fs::path(tmp.path()) / "there";
  fs::create_directories(here);
  fs::create_directories(there);
  const auto path = ptrain::train::checkpoint_path(here.string(), 7);
  save_in_parts(path, large_sample());
  save_in_parts(ptrain::train::checkpoint_path(there.string(), 7), large_sample());
  const auto parts = part_files(here), others = part_files(there);
  ASSERT_EQ(parts.size(), others.size());
  const std::string own = parts[3] + ".own";
  fs::copy_file(parts[3], own);
  fs::copy_file(others[3], parts[3], fs::copy_options::overwrite_existing);  // a well-formed part, with a checksum of its own
  std::string message = error_of([&] { ptrain::train::load_checkpoint(path); });
  EXPECT_NE(message.find(parts[3] + ": not the part " + path + " lists"), std::string::npos) << message;

  fs::rename(own, parts[3]);
  EXPECT_NO_THROW(ptrain::train::load_checkpoint(path));
  fs::remove(parts[5]);
  message = error_of([&] { ptrain::train::load_checkpoint(path); });
  EXPECT_NE(message.find(path + ": its part file " + parts[5] + " is missing"), std::string::npos) << message;
}

TEST(Checkpoint, RewritingAStepKeepsItsOldPartsUntilTheNewFileHasReplacedIt) {
  ptrain::testing::TempDir tmp;
  const auto path = ptrain::train::checkpoint_path(tmp.path(), 12);
  const Checkpoint first = large_sample(), second = large_sample();
  save_in_parts(path, first);
  const auto first_parts = part_files(tmp.path());
  bool held = false;
  save_in_parts(path, second, [&] {
    // The new parts are written, the new file not yet in place: the old checkpoint still loads whole.
    EXPECT_EQ(part_files(tmp.path()).size(), 2 * first_parts.size());
    expect_same_tensors(ptrain::train::load_checkpoint(path).model, first.model);
    held = true;
  });
  ASSERT_TRUE(held);
  const auto second_parts = part_files(tmp.path());
  ASSERT_EQ(second_parts.size(), first_parts.size());
  for (const auto& part : first_parts) EXPECT_FALSE(fs::exists(part)) << part;
  expect_same_tensors(ptrain::train::load_checkpoint(path).model, second.model);

  // Written again as one file: the parts it named go too.
  ptrain::train::save_checkpoint(path, second);
  EXPECT_TRUE(part_files(tmp.path()).empty());
  expect_same_tensors(ptrain::train::load_checkpoint(path).model, second.model);
}

TEST(Checkpoint, AFailedWriteInPartsLeavesThePreviousCheckpointAndNoPart) {
  ptrain::testing::TempDir tmp;
  const auto path = ptrain::train::checkpoint_path(tmp.path(), 3);
  save_in_parts(path, large_sample());
  const auto before = sorted_names(tmp.path());
  Checkpoint bad = large_sample();
  bad.optimizer.emplace_back("bad", torch::randn({2}, torch::kComplexFloat));  // the last part's write fails
  EXPECT_THROW(save_in_parts(path, bad), ptrain::Error);
  EXPECT_EQ(sorted_names(tmp.path()), before);
  EXPECT_NO_THROW(ptrain::train::load_checkpoint(path));
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
  save_in_parts(keep, large_sample());
  const auto kept = sorted_names(tmp.path());
  ASSERT_EQ(kept.size(), 1 + static_cast<size_t>(ptrain::train::kMaxCheckpointParts));
  for (const char* name : {"step-00000008.safetensors.tmp.Ab12Cd", "step-00000008.rank-00001.safetensors.tmp.x9Y8z7",
                           "step-00000008.part-2-0123abcd.safetensors.tmp.Zz9Yy8",
                           // parts of a write killed before its checkpoint file, and one of step 4's no longer named
                           "step-00000008.part-0-0123abcd.safetensors", "step-00000004.part-1-deadbeef.safetensors"})
    std::ofstream(tmp.file(name)) << "partial";
  std::ofstream(tmp.file("notes.tmp.Ab12Cd")) << "mine";
  std::ofstream(tmp.file("notes.part-1-deadbeef.safetensors")) << "mine";
  EXPECT_EQ(ptrain::train::remove_stale_temporaries(tmp.path()), 5);
  auto expected = kept;
  expected.insert(expected.end(), {"notes.part-1-deadbeef.safetensors", "notes.tmp.Ab12Cd"});
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(sorted_names(tmp.path()), expected);
  EXPECT_NO_THROW(ptrain::train::load_checkpoint(keep));
}

TEST(Checkpoint, RetentionKeepsTheNewestAndTheOneResumedFrom) {
  ptrain::testing::TempDir tmp;
  const auto at = [&](int64_t step) { return ptrain::train::checkpoint_path(tmp.path(), step); };
  for (int64_t step : {1, 2, 3, 4, 5}) ptrain::train::save_checkpoint(at(step), sample());
  save_in_parts(at(3), large_sample());  // its parts go with it
  std::ofstream(ptrain::train::shard_path(at(1), 0)) << "shard";
  std::ofstream(ptrain::train::shard_path(at(1), 1)) << "shard";
  const auto removed = ptrain::train::prune_checkpoints(tmp.path(), 2, at(2));
  EXPECT_EQ(removed, (std::vector<std::string>{at(1), at(3)}));
  for (int64_t step : {2, 4, 5}) EXPECT_TRUE(fs::exists(at(step))) << step;
  EXPECT_FALSE(fs::exists(ptrain::train::shard_path(at(1), 0)));
  EXPECT_FALSE(fs::exists(ptrain::train::shard_path(at(1), 1)));
  EXPECT_TRUE(part_files(tmp.path()).empty());
  EXPECT_TRUE(ptrain::train::prune_checkpoints(tmp.path(), 0, "").empty());  // 0: keep all
}

}  // namespace
