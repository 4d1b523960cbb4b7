// --async-checkpoint: checkpoints staged at the step and written in the background hold exactly what a
// synchronous save writes, resume as they do (also sharded over two gloo ranks), and a background write that
// fails fails the run naming its file, at the next save or at the run's end.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "multiprocess.h"
#include "ptrain/core/error.h"
#include "ptrain/train/checkpoint.h"
#include "ptrain/train/checkpointer.h"
#include "ptrain/train/plan.h"
#include "ptrain/train/trainer.h"
#include "remove_tree.h"
#include "test_support.h"

namespace {

namespace fs = std::filesystem;
using ptrain::train::Checkpoint;

// resnet20 on 96 samples of 16x16 at batch 8: 12 steps an epoch, 24 in all. SGD with momentum: its buffers,
// like the weights, change in place at the step after each save, while that save is being written.
ptrain::config::TrainConfig small_run(const std::string& checkpoint_dir, bool async) {
  ptrain::config::TrainConfig c;
  c.model.name = "resnet20";
  c.data.dataset = "synthetic";
  c.data.path = "96:3x16x16:4";
  c.run.batch_size = 8;
  c.run.epochs = 2;
  c.run.device = "cpu";
  c.run.threads = 1;
  c.run.seed = 11;
  c.run.progress = "none";
  c.run.checkpoint_dir = checkpoint_dir;
  c.run.checkpoint_every = 5;
  c.run.async_checkpoint = async;
  c.data.test_limit = 16;
  c.optim.lr = 0.05;
  return c;
}

ptrain::metrics::RunRecord train(const ptrain::config::TrainConfig& c, const ptrain::train::TrainHooks& hooks = {}) {
  return ptrain::train::train(ptrain::train::make_plan(c), "test", hooks);
}

std::map<std::string, torch::Tensor> by_name(const ptrain::io::NamedTensors& tensors) {
  return {tensors.begin(), tensors.end()};
}

// Every tensor of every section, bit for bit, and where the run stood.
void expect_same_content(const std::string& want_path, const std::string& got_path) {
  const Checkpoint want = ptrain::train::load_checkpoint(want_path), got = ptrain::train::load_checkpoint(got_path);
  EXPECT_EQ(got.position.epoch, want.position.epoch) << got_path;
  EXPECT_EQ(got.position.micro_batch, want.position.micro_batch) << got_path;
  EXPECT_EQ(got.position.global_step, want.position.global_step) << got_path;
  EXPECT_EQ(got.shards, want.shards) << got_path;
  const std::pair<const char*, ptrain::io::NamedTensors Checkpoint::*> sections[] = {
      {"model", &Checkpoint::model}, {"optimizer", &Checkpoint::optimizer},
      {"scaler", &Checkpoint::scaler}, {"progress", &Checkpoint::progress}};
  for (const auto& [section, member] : sections) {
    const auto w = by_name(want.*member), g = by_name(got.*member);
    ASSERT_EQ(g.size(), w.size()) << got_path << " " << section;
    for (const auto& [name, tensor] : w) {
      ASSERT_TRUE(g.count(name)) << got_path << " lacks " << section << "/" << name;
      EXPECT_TRUE(torch::equal(g.at(name), tensor)) << got_path << " " << section << "/" << name << " differs";
    }
  }
}

std::vector<std::string> names_of(const std::vector<std::string>& paths) {
  std::vector<std::string> names;
  for (const auto& p : paths) names.push_back(fs::path(p).filename().string());
  return names;
}

// Sets an environment variable for its scope (the runs' checkpointers read the test seams at their start).
class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* name, const std::string& value) : name_(name) { ::setenv(name, value.c_str(), 1); }
  ~ScopedEnvironment() { ::unsetenv(name_); }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  const char* name_;
};

// The asynchronous run writes its checkpoints of about 2 MiB in part files (checkpoint.h), as a large model's
// are: the same content as the synchronous run's single files, and the run resumed from them the same.
TEST(AsyncCheckpoint, HoldsWhatASynchronousSaveWritesAndResumesBitForBit) {
  ptrain::testing::TempDir tmp;
  const fs::path dir = tmp.path();
  const auto sync = train(small_run((dir / "sync").string(), false));
  const ScopedEnvironment in_parts(ptrain::train::kTestPartBytesVariable, "65536");
  const auto async = train(small_run((dir / "async").string(), true));
  EXPECT_EQ(ptrain::train::load_checkpoint(ptrain::train::checkpoint_path((dir / "async").string(), 5)).parts,
            ptrain::train::kMaxCheckpointParts);

  const auto sync_files = ptrain::train::list_checkpoints((dir / "sync").string());
  const auto async_files = ptrain::train::list_checkpoints((dir / "async").string());
  // Steps 5, 10, 12 (the epoch's end), 15, 20 and 24: each taken while the next steps changed the weights.
  ASSERT_EQ(sync_files.size(), 6u);
  ASSERT_EQ(names_of(async_files), names_of(sync_files));
  for (size_t i = 0; i < sync_files.size(); ++i) expect_same_content(sync_files[i], async_files[i]);
  for (const auto& name : fs::directory_iterator(dir / "async"))
    EXPECT_EQ(name.path().filename().string().find(".tmp."), std::string::npos) << name.path();

  // The record: what saving cost the step, and the writes the background took.
  ASSERT_TRUE(sync.checkpoint_blocking_seconds.has_value());
  EXPECT_GT(*sync.checkpoint_blocking_seconds, 0);
  EXPECT_FALSE(sync.checkpoint_write_seconds.has_value());
  ASSERT_TRUE(async.checkpoint_blocking_seconds.has_value());
  ASSERT_TRUE(async.checkpoint_write_seconds.has_value());
  EXPECT_GT(*async.checkpoint_write_seconds, 0);
  const auto& writes = async.extra["checkpoint_writes"];
  const auto& phases = async.extra["checkpoint_write_phases"];
  ASSERT_EQ(phases.size(), writes.size());
  ASSERT_EQ(phases.size(), 6u);
  for (size_t i = 0; i < phases.size(); ++i) {
    EXPECT_GT(phases[i]["files"].get<double>(), 0) << phases.dump();
    EXPECT_LE(phases[i]["files"].get<double>() + phases[i]["pruning_waited"].get<double>(), writes[i].get<double>())
        << phases.dump();
    EXPECT_GE(phases[i]["copies_waited"].get<double>(), 0) << phases.dump();
    EXPECT_GE(phases[i]["copies_queued"].get<double>(), 0) << phases.dump();
    EXPECT_LE(phases[i]["copies_queued"].get<double>(), phases[i]["files"].get<double>()) << phases.dump();
  }
  EXPECT_EQ(async.extra["run_end"]["checkpoint"], async_files.back());

  // Resumed from the asynchronous checkpoint of step 5 (mid-epoch), asynchronously: the synchronous run's end.
  auto resumed_config = small_run((dir / "resumed").string(), true);
  resumed_config.run.resume = ptrain::train::checkpoint_path((dir / "async").string(), 5);
  const auto resumed = train(resumed_config);
  EXPECT_EQ(resumed.steps, 24);
  expect_same_content(sync_files.back(), ptrain::train::checkpoint_path((dir / "resumed").string(), 24));
  EXPECT_DOUBLE_EQ(*resumed.final_test_accuracy, *sync.final_test_accuracy);
}

// --keep-checkpoints under --async-checkpoint: each write's removals run beside the steps after it, and the next
// write waits for them before its files; the run's end waits for the last ones. What is left is what a
// synchronous run keeps, every checkpoint in its part files (removed a thread each) and nothing else.
TEST(AsyncCheckpoint, KeepCheckpointsRemovesOldOnesBesideTheStepsAndLeavesWhatASynchronousRunKeeps) {
  ptrain::testing::TempDir tmp;
  const ScopedEnvironment in_parts(ptrain::train::kTestPartBytesVariable, "65536");
  std::map<bool, std::vector<std::string>> kept;
  for (const bool async : {false, true}) {
    const std::string dir = tmp.file(async ? "async" : "sync");
    auto c = small_run(dir, async);
    c.run.keep_checkpoints = 2;
    const auto record = train(c);
    kept[async] = names_of(ptrain::train::list_checkpoints(dir));
    const std::string step_20 = fs::path(ptrain::train::checkpoint_path(dir, 20)).stem().string();
    const std::string step_24 = fs::path(ptrain::train::checkpoint_path(dir, 24)).stem().string();
    size_t parts = 0;
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (name == ptrain::train::kCheckpointLockFile) continue;
      const bool of_a_kept_checkpoint = name.rfind(step_20 + ".", 0) == 0 || name.rfind(step_24 + ".", 0) == 0;
      EXPECT_TRUE(of_a_kept_checkpoint) << "async " << async << ": " << name << " was left";
      parts += name.find(".part-") != std::string::npos;
    }
    EXPECT_EQ(parts, 2 * static_cast<size_t>(ptrain::train::kMaxCheckpointParts)) << "async " << async;
    if (!async) continue;
    // Saves at steps 5, 10, 12, 15, 20 and 24: from the second write on, each waited for the removals after the
    // write before it, which it records.
    const auto& phases = record.extra.at("checkpoint_write_phases");
    ASSERT_EQ(phases.size(), 6u) << phases.dump();
    EXPECT_EQ(phases[0]["pruning"].get<double>(), 0) << phases.dump();
    for (size_t i = 1; i < phases.size(); ++i) EXPECT_GT(phases[i]["pruning"].get<double>(), 0) << phases.dump();
  }
  EXPECT_EQ(kept[true], kept[false]);
  EXPECT_EQ(kept[true], names_of({ptrain::train::checkpoint_path(tmp.file("async"), 20),
                                   ptrain::train::checkpoint_path(tmp.file("async"), 24)}));
}

// A regular file where the directory was: the write's temporary file cannot be created there.
void break_directory(const fs::path& dir) {
  fs::remove_all(dir);
  std::ofstream(dir) << "not a directory";
}

// A --checkpoint-every step that ends an epoch is saved once, by the epoch's closing save: 12 steps an epoch,
// a checkpoint every 6, saves at steps 6, 12, 18 and 24, each in the record's list of what saves held the step.
TEST(AsyncCheckpoint, AStepThatEndsAnEpochIsSavedOnce) {
  ptrain::testing::TempDir tmp;
  for (const bool async : {false, true}) {
    auto c = small_run(tmp.file(async ? "async" : "sync"), async);
    c.run.checkpoint_every = 6;
    const auto record = train(c);
    const auto& blocking = record.extra.at("checkpoint_blocking");
    EXPECT_EQ(blocking.at("saves").size(), 4u) << "async " << async << ": " << blocking.dump();
    EXPECT_EQ(blocking.at("end_wait").get<double>() > 0, async) << blocking.dump();
    // Each save's wait for the write before it is a part of that save.
    ASSERT_EQ(blocking.at("waits").size(), 4u) << blocking.dump();
    for (size_t i = 0; i < 4; ++i)
      EXPECT_LE(blocking.at("waits")[i].get<double>(), blocking.at("saves")[i].get<double>()) << blocking.dump();
    // The background writes, one by one, add up to the record's total.
    ASSERT_EQ(record.extra.contains("checkpoint_writes"), async);
    if (!async) continue;
    const auto& writes = record.extra.at("checkpoint_writes");
    ASSERT_EQ(writes.size(), 4u) << writes.dump();
    double total = 0;
    for (const auto& seconds : writes) total += seconds.get<double>();
    EXPECT_NEAR(total, *record.checkpoint_write_seconds, 1e-9) << writes.dump();
  }
}

TEST(AsyncCheckpoint, AFailedBackgroundWriteFailsTheNextSaveNamingItsFile) {
  ptrain::testing::TempDir tmp;
  const fs::path ck = fs::path(tmp.path()) / "ck";
  ptrain::train::TrainHooks hooks;
  // Step 5's save is handed to the writer after this, and fails there; training goes on to step 10's save.
  hooks.on_step = [&](const ptrain::train::StepReport& step) {
    if (step.global_step == 5) break_directory(ck);
  };
  int64_t last_step = 0;
  const auto counting = hooks.on_step;
  hooks.on_step = [&](const ptrain::train::StepReport& step) {
    last_step = step.global_step;
    counting(step);
  };
  try {
    train(small_run(ck.string(), true), hooks);
    FAIL() << "the run ignored its failed checkpoint write";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--async-checkpoint: the background write of " +
                        ptrain::train::checkpoint_path(ck.string(), 5) + " failed: "),
              std::string::npos) << what;
  }
  EXPECT_EQ(last_step, 10) << "the failure surfaced at step 10's save, the next one";
}

TEST(AsyncCheckpoint, AFailedLastWriteFailsTheRunAtItsEnd) {
  ptrain::testing::TempDir tmp;
  const fs::path ck = fs::path(tmp.path()) / "ck";
  auto c = small_run(ck.string(), true);
  c.run.checkpoint_every = 0;
  c.run.epochs = 1;
  c.model.save_weights = (fs::path(tmp.path()) / "weights.safetensors").string();
  ptrain::train::TrainHooks hooks;
  hooks.on_step = [&](const ptrain::train::StepReport& step) {
    if (step.global_step == 12) break_directory(ck);
  };
  try {
    train(c, hooks);
    FAIL() << "the run ended as if its last checkpoint were written";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--async-checkpoint: the background write of " +
                        ptrain::train::checkpoint_path(ck.string(), 12) + " failed: "),
              std::string::npos) << what;
  }
  // --save-weights comes after the last checkpoint's write, which failed.
  EXPECT_FALSE(fs::exists(c.model.save_weights));
}

TEST(AsyncCheckpoint, WithoutACheckpointDirectoryIsAUsageErrorNamingTheFlag) {
  auto c = small_run("", true);
  c.run.checkpoint_every = 0;
  try {
    ptrain::train::make_plan(c);
    FAIL() << "--async-checkpoint without --checkpoint-dir was accepted";
  } catch (const ptrain::Error& e) {
    EXPECT_STREQ(e.what(), "--async-checkpoint needs --checkpoint-dir");
  }
}

// Two gloo ranks of zero2 with sharded checkpoints: 80 samples at 8 a rank, 5 steps an epoch, 10 in all.
ptrain::config::TrainConfig sharded_run(const std::string& checkpoint_dir, bool async, const std::string& resume) {
  auto c = small_run(checkpoint_dir, async);
  c.data.path = "80:3x8x8:4";
  c.run.strategy = "zero2";
  c.sharding.state_dict = "sharded";
  c.run.checkpoint_every = 2;
  c.run.resume = resume;
  c.dist.timeout_seconds = 60;
  return c;
}

void run_two_ranks(const ptrain::config::TrainConfig& c) {
  const int port = ptrain::testing::free_port();
  const auto outcomes = ptrain::testing::run_world(2, [&](int rank) {
    ptrain::testing::set_launch_environment(rank, 2, port);
    train(c);
  }, 180);
  for (const auto& o : outcomes) ASSERT_EQ(o.exit_code, 0) << o.message;
}

TEST(AsyncCheckpoint, ShardedOverTwoRanksMatchesSynchronousAndResumesToTheUninterruptedRun) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const std::string dir = ptrain::testing::temp_dir("async_sharded");
  const std::string sync_dir = dir + "/sync", async_dir = dir + "/async", resumed_dir = dir + "/resumed";
  run_two_ranks(sharded_run(sync_dir, false, ""));
  run_two_ranks(sharded_run(async_dir, true, ""));
  const auto sync_files = ptrain::train::list_checkpoints(sync_dir);
  ASSERT_EQ(names_of(ptrain::train::list_checkpoints(async_dir)), names_of(sync_files));
  ASSERT_EQ(sync_files.size(), 6u);  // steps 2, 4, 5 (the epoch's end), 6, 8, 10
  for (const auto& file : sync_files) {
    const std::string async_file = async_dir + "/" + fs::path(file).filename().string();
    EXPECT_EQ(ptrain::train::load_checkpoint(async_file).shards, 2) << async_file;
    expect_same_content(file, async_file);
  }
  run_two_ranks(sharded_run(resumed_dir, true, ptrain::train::checkpoint_path(async_dir, 4)));
  expect_same_content(sync_files.back(), ptrain::train::checkpoint_path(resumed_dir, 10));
  ptrain::testing::remove_tree(dir);
}

}  // namespace
