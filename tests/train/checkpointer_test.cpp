// The checkpoint directory one run owns (train/checkpointer.h): a second run is refused while the first
// holds it, and removes nothing of the first's; a fresh run never mixes its checkpoints with an earlier
// run's; retention counts only the run's own.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "ptrain/core/error.h"
#include "ptrain/train/checkpoint.h"
#include "ptrain/train/checkpointer.h"
#include "test_support.h"

namespace {

namespace fs = std::filesystem;
using ptrain::train::Checkpoint;
using ptrain::train::Checkpointer;
using ptrain::train::CheckpointerOptions;

Checkpoint at_step(int64_t step) {
  Checkpoint c;
  c.position.global_step = step;
  c.model = {{"w", torch::full({2}, static_cast<float>(step))}};
  return c;
}

std::string error_of(const std::function<void()>& f) { return ptrain::testing::error_message<ptrain::Error>(f); }

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(Checkpointer, ASecondRunIsRefusedNamingTheHolderAndRemovesNothingOfIts) {
  ptrain::testing::TempDir tmp;
  const std::string dir = tmp.file("ck");
  auto first = std::make_unique<Checkpointer>(CheckpointerOptions{dir});
  // The first run's write in progress: a second run must not take it for a killed write's leftover.
  const std::string live = dir + "/step-00000005.safetensors.tmp.Ab12Cd";
  std::ofstream(live) << "being written";
  const std::string message = error_of([&] { Checkpointer second(CheckpointerOptions{dir}); });
  EXPECT_NE(message.find("--checkpoint-dir " + dir + " is in use by another run"), std::string::npos) << message;
  EXPECT_NE(message.find("pid " + std::to_string(::getpid()) + " on "), std::string::npos) << message;
  EXPECT_TRUE(fs::exists(live));
  // Ranks of the first run's job other than its rank 0 share the directory without a lock of their own.
  EXPECT_NO_THROW(Checkpointer(CheckpointerOptions{dir, 0, "", false, /*owner=*/false}));

  first.reset();  // the run ends: the lock is released, the leftover is now stale
  Checkpointer third(CheckpointerOptions{dir});
  EXPECT_FALSE(fs::exists(live));
}

TEST(Checkpointer, AFreshRunRefusesAnotherRunsCheckpointsUnlessItResumesOrOverwrites) {
  ptrain::testing::TempDir tmp;
  const std::string dir = tmp.path();
  const auto path = [&](int64_t step) { return ptrain::train::checkpoint_path(dir, step); };
  for (int64_t step : {10, 20}) ptrain::train::save_checkpoint(path(step), at_step(step));
  std::ofstream(ptrain::train::shard_path(path(20), 0)) << "shard";

  const std::string message = error_of([&] { Checkpointer fresh(CheckpointerOptions{dir}); });
  EXPECT_NE(message.find("--checkpoint-dir " + dir + " holds 2 checkpoint(s) of another run, the newest " + path(20)),
            std::string::npos) << message;
  EXPECT_NE(message.find("--resume latest"), std::string::npos) << message;
  EXPECT_NE(message.find("--overwrite-checkpoints"), std::string::npos) << message;
  EXPECT_TRUE(fs::exists(path(10)) && fs::exists(path(20)));

  EXPECT_NO_THROW(Checkpointer(CheckpointerOptions{dir, 0, path(20)}));  // continuing that run
  EXPECT_TRUE(fs::exists(path(10)) && fs::exists(path(20)));

  // Overwriting removes the old run's files first, so that retention keeps the new run's newest: an old
  // step 20 must not outrank the new run's steps 1 to 3.
  Checkpointer overwriting(CheckpointerOptions{dir, 2, "", /*overwrite=*/true});
  for (int64_t step : {1, 2, 3}) overwriting.write(path(step), at_step(step));
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{".ptrain.lock", "step-00000002.safetensors",
                                                      "step-00000003.safetensors"}));
  EXPECT_EQ(overwriting.last_written(), path(3));
  EXPECT_EQ(overwriting.last_written_step(), 3);
  EXPECT_EQ(ptrain::train::latest_checkpoint(dir), path(3));
}

// A run resumed from an older checkpoint starts a new line: --resume latest takes that line's newest, never
// the abandoned branch's higher steps (it took step 24 over a resumed line's step 12, losing its steps 9-12
// unsaid), and names the ones it passes over.
TEST(Checkpointer, LatestIsTheNewestOfTheLineWrittenLastNotOfAnAbandonedBranch) {
  ptrain::testing::TempDir tmp;
  const std::string dir = tmp.path();
  const auto path = [&](int64_t step) { return ptrain::train::checkpoint_path(dir, step); };
  std::string first_run;
  {
    Checkpointer first(CheckpointerOptions{dir});
    for (int64_t step : {8, 16, 24}) first.write(path(step), at_step(step));
    first_run = first.run_id();
  }
  EXPECT_EQ(ptrain::train::latest_checkpoint(dir), path(24));
  {
    Checkpointer branch(CheckpointerOptions{dir, 0, path(8)});
    for (int64_t step : {9, 10, 11, 12}) branch.write(path(step), at_step(step));
  }
  auto latest = ptrain::train::find_latest_checkpoint(dir);
  EXPECT_EQ(latest.path, path(12));
  EXPECT_EQ(latest.passed_over, (std::vector<std::string>{path(16), path(24)}));
  const auto lineage = ptrain::train::load_checkpoint(path(12)).lineage;
  EXPECT_EQ(lineage.parent_run_id, first_run);
  EXPECT_EQ(lineage.parent_step, 8);
  EXPECT_EQ(lineage.parent_file, "step-00000008.safetensors");
  EXPECT_NE(lineage.run_id, first_run);

  // The line goes on from its newest: its step 16 replaces the abandoned one's file; step 24 stays passed over.
  {
    Checkpointer resumed(CheckpointerOptions{dir, 0, latest.path});
    resumed.write(path(16), at_step(16));
  }
  latest = ptrain::train::find_latest_checkpoint(dir);
  EXPECT_EQ(latest.path, path(16));
  EXPECT_EQ(latest.passed_over, (std::vector<std::string>{path(24)}));

  // Resuming the abandoned branch by its path makes it the line written last again.
  {
    Checkpointer back(CheckpointerOptions{dir, 0, path(24)});
    back.write(path(25), at_step(25));
  }
  latest = ptrain::train::find_latest_checkpoint(dir);
  EXPECT_EQ(latest.path, path(25));
  EXPECT_TRUE(latest.passed_over.empty());
}

// Checkpoints written before lineage was recorded load as before and count as older than any with one; among
// themselves the highest step is the latest.
TEST(Checkpointer, CheckpointsWithoutLineageStayLoadableAndStartALine) {
  ptrain::testing::TempDir tmp;
  const std::string dir = tmp.path();
  const auto path = [&](int64_t step) { return ptrain::train::checkpoint_path(dir, step); };
  for (int64_t step : {4, 8}) ptrain::train::save_checkpoint(path(step), at_step(step));  // no lineage
  EXPECT_EQ(ptrain::train::load_checkpoint(path(8)).lineage.run_id, "");
  EXPECT_EQ(ptrain::train::latest_checkpoint(dir), path(8));
  EXPECT_TRUE(ptrain::train::find_latest_checkpoint(dir).passed_over.empty());
  {
    Checkpointer resumed(CheckpointerOptions{dir, 0, path(4)});
    resumed.write(path(5), at_step(5));
  }
  const auto latest = ptrain::train::find_latest_checkpoint(dir);
  EXPECT_EQ(latest.path, path(5));
  EXPECT_EQ(latest.passed_over, (std::vector<std::string>{path(8)}));
  const auto lineage = ptrain::train::load_checkpoint(path(5)).lineage;
  EXPECT_EQ(lineage.parent_run_id, "");
  EXPECT_EQ(lineage.parent_step, 4);
}

// --keep-checkpoints keeps the checkpoints written last: a line resumed from step 8 keeps its new ones, and
// the abandoned branch's higher steps go first.
TEST(Checkpointer, RetentionOfAResumedLineKeepsItsOwnNewestOverAnAbandonedBranch) {
  ptrain::testing::TempDir tmp;
  const std::string dir = tmp.path();
  const auto path = [&](int64_t step) { return ptrain::train::checkpoint_path(dir, step); };
  {
    Checkpointer first(CheckpointerOptions{dir});
    for (int64_t step : {8, 16, 24}) first.write(path(step), at_step(step));
  }
  Checkpointer branch(CheckpointerOptions{dir, 2, path(8)});
  for (int64_t step : {9, 10, 11}) branch.write(path(step), at_step(step));
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{".ptrain.lock", "step-00000008.safetensors",
                                                      "step-00000010.safetensors", "step-00000011.safetensors"}));
}

}  // namespace

namespace {

using ptrain::train::StagingPlace;

// What the writer thread gets is the state at the save: the next step's in-place updates of the weights and
// the optimizer's moments, running while the write is in flight, never reach it.
TEST(CheckpointStaging, LaterInPlaceUpdatesNeverReachTheStagedCopy) {
  auto weight = torch::arange(6, torch::kFloat).reshape({2, 3});
  auto moment = torch::full({4}, 0.5, torch::kDouble);
  const auto weight_then = weight.clone(), moment_then = moment.clone();
  auto staged = ptrain::train::stage_sections({{{"w", weight}}, {{"m", moment}, {"none", torch::Tensor()}}});
  weight.add_(1);
  moment.mul_(3);
  EXPECT_EQ(staged->place(), StagingPlace::host);
  EXPECT_EQ(staged->device_bytes(), 0);
  const auto sections = staged->finish();
  ASSERT_EQ(sections.size(), 2u);
  ASSERT_EQ(sections[1].size(), 2u);
  EXPECT_TRUE(torch::equal(sections[0][0].second, weight_then));
  EXPECT_TRUE(torch::equal(sections[1][0].second, moment_then));
  EXPECT_EQ(sections[1][0].first, "m");
  EXPECT_FALSE(sections[1][1].second.defined());
  EXPECT_FALSE(torch::equal(sections[0][0].second, weight));  // a copy, not a view of the weight
}

// A snapshot on the device leaves 5% of it, at least 1 GiB, to the steps that run beside its copy.
TEST(CheckpointStaging, ADeviceSnapshotFitsOnlyBesideItsHeadroom) {
  constexpr int64_t GiB = int64_t{1} << 30;
  const int64_t h100 = 80 * GiB;  // headroom 4 GiB
  EXPECT_TRUE(ptrain::train::device_snapshot_fits(10 * GiB, 14 * GiB, h100));
  EXPECT_FALSE(ptrain::train::device_snapshot_fits(10 * GiB, 14 * GiB - 1, h100));
  const int64_t small = 8 * GiB;  // 5% is under the 1 GiB floor
  EXPECT_TRUE(ptrain::train::device_snapshot_fits(2 * GiB, 3 * GiB, small));
  EXPECT_FALSE(ptrain::train::device_snapshot_fits(2 * GiB, 3 * GiB - 1, small));
  EXPECT_FALSE(ptrain::train::device_snapshot_fits(1, 0, small));
}

// The asynchronous write of a checkpoint staged as above holds the values at the save, whatever happened to
// the originals meanwhile.
TEST(CheckpointStaging, AnAsyncWriteHoldsTheStateAtItsSave) {
  ptrain::testing::TempDir tmp;
  CheckpointerOptions options;
  options.dir = tmp.file("ck");
  options.async = true;
  Checkpointer checkpointer(options);
  Checkpoint checkpoint = at_step(3);
  auto weight = checkpoint.model[0].second;
  const auto weight_then = weight.clone();
  checkpointer.write(checkpointer.path_for(3), checkpoint);
  weight.fill_(-7);
  checkpointer.wait();
  EXPECT_EQ(checkpointer.staging(), StagingPlace::host);
  const Checkpoint written = ptrain::train::load_checkpoint(checkpointer.path_for(3));
  ASSERT_EQ(written.model.size(), 1u);
  EXPECT_TRUE(torch::equal(written.model[0].second, weight_then));
}

}  // namespace
