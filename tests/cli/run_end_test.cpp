// How a run ends through the ptrain executable: stopped by SIGTERM it saves the step it stopped at, writes
// its record and exits 143, and resumed it ends on the weights of a run never stopped; a checkpoint
// directory is one run's (a second run is refused while the first holds it; a fresh run does not write
// into an earlier run's checkpoints); --save-weights that cannot be written is refused before training.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "command.h"
#include "remove_tree.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;

using Result = ptrain::testing::CommandResult;

int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

Result run(const std::string& args) { return ptrain::testing::run_command(std::string(PTRAIN_EXECUTABLE) + " " + args); }

// `ptrain args` in the background, its output into log; environment: "NAME=value ..." for it alone.
pid_t start(const std::string& args, const std::string& log, const std::string& environment = "") {
  const std::string command = "exec " + (environment.empty() ? "" : "env " + environment + " ") +
                              std::string(PTRAIN_EXECUTABLE) + " " + args + " > " + log + " 2>&1";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/bash", "bash", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

int wait_for_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return exit_code_of(status);
}

bool wait_until(const std::function<bool()>& condition, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

fs::path scratch(const std::string& name) { return ptrain::testing::fresh_named_dir("run_end_" + name); }

std::string checkpoint(const fs::path& dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof(name), "step-%08lld.safetensors", static_cast<long long>(step));
  return (dir / name).string();
}

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// "crc32:..." of a checkpoint's weights, as `ptrain verify` prints it.
std::string weights_digest(const std::string& path) {
  const Result r = run("verify " + path);
  std::smatch m;
  EXPECT_TRUE(std::regex_search(r.output, m, std::regex("weights (crc32:[0-9a-f]{8})"))) << r.output;
  return m.size() > 1 ? m[1].str() : "";
}

// 8 steps an epoch of resnet20 on 16x16 images, one thread: tens of milliseconds a step.
std::string run_of(int epochs) {
  return "train --model resnet20 --dataset synthetic --data-path 64:3x16x16:4 --batch-size 8 --device cpu "
         "--threads 1 --progress none --test-limit 16 --warmup-epochs 0 --lr 0.05 --schedule constant --epochs " +
         std::to_string(epochs) + " ";
}

TEST(RunEnd, SigtermSavesTheStepItStoppedAtAndTheResumedRunEndsOnTheWeightsOfOneNeverStopped) {
  const auto dir = scratch("sigterm");
  const auto stopped_dir = dir / "stopped", whole_dir = dir / "whole";
  const std::string metrics = (dir / "stopped.json").string(), log = (dir / "stopped.log").string();
  const std::string args = run_of(3) + "--checkpoint-every 5 --checkpoint-dir " + stopped_dir.string();
  const pid_t pid = start(args + " --metrics-out " + metrics, log);
  ASSERT_TRUE(wait_until([&] { return fs::exists(checkpoint(stopped_dir, 5)); }, 120)) << read_text(log);
  ::kill(pid, SIGTERM);
  EXPECT_EQ(wait_for_exit(pid), 143) << read_text(log);
  const std::string output = read_text(log);

  std::smatch m;
  ASSERT_TRUE(std::regex_search(output, m, std::regex("ptrain: stopped by SIGTERM after step (\\d+) of 24"))) << output;
  const int64_t stopped_at = std::stoll(m[1]);
  EXPECT_GE(stopped_at, 5);
  ASSERT_LT(stopped_at, 24) << "the run ended before the signal came: " << output;
  EXPECT_NE(output.find("its checkpoint is " + checkpoint(stopped_dir, stopped_at) +
                        "; continue with the same command and --resume latest"), std::string::npos) << output;
  EXPECT_TRUE(fs::exists(checkpoint(stopped_dir, stopped_at))) << output;
  EXPECT_FALSE(fs::exists(checkpoint(stopped_dir, stopped_at + 1))) << output;
  ASSERT_TRUE(fs::exists(metrics)) << output;
  const auto record = nlohmann::json::parse(std::ifstream(metrics));
  EXPECT_EQ(record["steps"], stopped_at);
  EXPECT_EQ(record["extra"]["run_end"]["status"], "interrupted") << record["extra"].dump();
  EXPECT_EQ(record["extra"]["run_end"]["signal"], "SIGTERM");
  EXPECT_EQ(record["extra"]["run_end"]["checkpoint"], checkpoint(stopped_dir, stopped_at));

  const Result resumed = run(args + " --resume latest");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const Result whole = run(run_of(3) + "--checkpoint-dir " + whole_dir.string());
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  EXPECT_EQ(weights_digest(checkpoint(stopped_dir, 24)), weights_digest(checkpoint(whole_dir, 24)));
  ptrain::testing::remove_tree(dir);
}

TEST(RunEnd, ASecondRunInACheckpointDirectoryAnotherRunHoldsIsRefusedAndTouchesNothing) {
  const auto dir = scratch("two_runs");
  const auto shared = dir / "ck";
  const std::string log = (dir / "first.log").string();
  const pid_t first = start(run_of(200) + "--checkpoint-every 1 --checkpoint-dir " + shared.string(), log);
  ASSERT_TRUE(wait_until([&] { return fs::exists(checkpoint(shared, 1)); }, 120)) << read_text(log);
  const Result second = run(run_of(1) + "--checkpoint-dir " + shared.string() + " --resume latest");
  EXPECT_EQ(second.exit_code, 2) << second.output;
  EXPECT_NE(second.output.find("ptrain: error: --checkpoint-dir " + shared.string() + " is in use by another run (pid " +
                               std::to_string(first) + " on "), std::string::npos) << second.output;
  EXPECT_EQ(second.output.find("epoch 1:"), std::string::npos) << "trained first: " << second.output;
  ::kill(first, SIGTERM);
  EXPECT_EQ(wait_for_exit(first), 143) << read_text(log);
  // Every checkpoint the first run left is whole: nothing of it was removed or overwritten as stale.
  std::string checkpoints;
  for (const auto& name : files_in(shared)) {
    if (name == ".ptrain.lock") continue;
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << name;
    checkpoints += " " + (shared / name).string();
  }
  const Result verified = run("verify" + checkpoints);
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
  ptrain::testing::remove_tree(dir);
}

// 4 steps an epoch of resnet20 on 8x8 images.
const std::string kTiny =
    "train --model resnet20 --dataset synthetic --data-path 64:3x8x8:4 --batch-size 16 --device cpu "
    "--threads 1 --progress none --test-limit 16 --warmup-epochs 0 ";

TEST(RunEnd, AFreshRunDoesNotWriteIntoAnEarlierRunsCheckpointsUnlessTold) {
  const auto dir = scratch("used_dir");
  const std::string ck = (dir / "ck").string();
  ASSERT_EQ(run(kTiny + "--epochs 3 --checkpoint-every 1 --checkpoint-dir " + ck).exit_code, 0);
  const Result refused = run(kTiny + "--epochs 1 --checkpoint-every 1 --keep-checkpoints 2 --checkpoint-dir " + ck);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("ptrain: error: --checkpoint-dir " + ck + " holds 12 checkpoint(s) of another run"),
            std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("--overwrite-checkpoints"), std::string::npos) << refused.output;
  EXPECT_EQ(files_in(ck).size(), 13u);  // untouched: 12 checkpoints and the lock file

  const Result overwriting = run(kTiny + "--epochs 1 --checkpoint-every 1 --keep-checkpoints 2 "
                                 "--overwrite-checkpoints --checkpoint-dir " + ck);
  ASSERT_EQ(overwriting.exit_code, 0) << overwriting.output;
  EXPECT_NE(overwriting.output.find("removed 12 checkpoint(s) of another run"), std::string::npos) << overwriting.output;
  EXPECT_EQ(files_in(ck), (std::vector<std::string>{".ptrain.lock", "step-00000003.safetensors",
                                                     "step-00000004.safetensors"}));
  EXPECT_NE(run(kTiny + "--epochs 1 --overwrite-checkpoints --resume latest --checkpoint-dir " + ck).output.find(
                "ptrain: error: --overwrite-checkpoints starts over"),
            std::string::npos);
  ptrain::testing::remove_tree(dir);
}

TEST(RunEnd, SaveWeightsThatCannotBeWrittenIsRefusedBeforeTraining) {
  const auto dir = scratch("save_weights");
  const auto a_file = (dir / "a-file").string(), a_directory = (dir / "w.pt").string();
  std::ofstream(a_file) << "x";
  fs::create_directories(a_directory);
  for (const auto& weights : {a_directory, a_file + "/w.pt"}) {
    const Result r = run(kTiny + "--epochs 1 --save-weights " + weights);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("ptrain: error: --save-weights " + weights), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("epoch 1:"), std::string::npos) << "trained first: " << r.output;
  }
  ptrain::testing::remove_tree(dir);
}

// The temporary file of an atomic write of checkpoint `step` in dir, once one exists: its write is in flight.
bool writing(const fs::path& dir, int64_t step) {
  const std::string prefix = fs::path(checkpoint(dir, step)).filename().string() + ".tmp.";
  std::error_code not_yet;  // the run creates dir once it starts
  for (const auto& entry : fs::directory_iterator(dir, not_yet))
    if (entry.path().filename().string().rfind(prefix, 0) == 0) return true;
  return false;
}

// --async-checkpoint with the writer held open before each rename (checkpointer.h's test seam), in the background.
pid_t start_with_write_delay(int64_t delay_ms, const std::string& args, const std::string& log) {
  return start(args, log, "PTRAIN_TEST_CHECKPOINT_WRITE_DELAY_MS=" + std::to_string(delay_ms));
}

// The checkpoints are written in part files (checkpoint.h's, made small by their test seam), as a large model's
// are: the kill comes once the parts are in place and the file that names them is not.
TEST(RunEnd, KillDashNineDuringABackgroundWriteLeavesThePreviousCheckpointWhichResumesExactly) {
  const auto dir = scratch("async_kill");
  const auto ck = dir / "ck", whole_dir = dir / "whole";
  const std::string in_parts = "PTRAIN_TEST_CHECKPOINT_PART_BYTES=4096";
  const std::string args = run_of(3) + "--checkpoint-every 5 --async-checkpoint --checkpoint-dir " + ck.string();
  const Result paused = ptrain::testing::run_command("env " + in_parts + " " + PTRAIN_EXECUTABLE + " " + args + " --stop-at-step 5");
  ASSERT_EQ(paused.exit_code, 0) << paused.output;
  ASSERT_TRUE(fs::exists(checkpoint(ck, 5))) << paused.output;

  // The resumed run's first save (step 8, the epoch's end) is held in flight, its temporary file written,
  // until the kill.
  const std::string log = (dir / "killed.log").string();
  const pid_t pid = start(args + " --resume latest", log, "PTRAIN_TEST_CHECKPOINT_WRITE_DELAY_MS=600000 " + in_parts);
  ASSERT_TRUE(wait_until([&] { return writing(ck, 8); }, 120)) << read_text(log);
  ::kill(pid, SIGKILL);
  EXPECT_EQ(wait_for_exit(pid), 137) << read_text(log);
  EXPECT_FALSE(fs::exists(checkpoint(ck, 8)));
  // What the killed write left: its temporary file and its parts, which no checkpoint names.
  std::vector<std::string> left, parts_of_5;
  for (const auto& name : files_in(ck)) {
    if (name.rfind("step-00000008.", 0) == 0) left.push_back(name);
    if (name.rfind("step-00000005.part-", 0) == 0) parts_of_5.push_back((ck / name).string());
  }
  EXPECT_GT(left.size(), 2u) << "the parts of step 8 were not written before its file";
  ASSERT_FALSE(parts_of_5.empty()) << "step 5 was written as one file";
  const Result verified = run("verify " + checkpoint(ck, 5) + " " + parts_of_5.front());
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
  EXPECT_NE(verified.output.find(parts_of_5.front() + ": ok, part file "), std::string::npos) << verified.output;

  const Result resumed = run(args + " --resume latest");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("removed " + std::to_string(left.size()) +
                                " file(s) left by interrupted checkpoint writes"),
            std::string::npos)
      << resumed.output;
  const Result whole = run(run_of(3) + "--checkpoint-dir " + whole_dir.string());
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  EXPECT_EQ(weights_digest(checkpoint(ck, 24)), weights_digest(checkpoint(whole_dir, 24)));
  ptrain::testing::remove_tree(dir);
}

TEST(RunEnd, SigtermDuringABackgroundWriteWaitsForItAndSavesTheStepItStoppedAt) {
  const auto dir = scratch("async_sigterm");
  const auto ck = dir / "ck";
  const std::string metrics = (dir / "stopped.json").string(), log = (dir / "stopped.log").string();
  constexpr int64_t kDelayMs = 2000;
  const pid_t pid = start_with_write_delay(
      kDelayMs, run_of(3) + "--checkpoint-every 5 --async-checkpoint --checkpoint-dir " + ck.string() +
                    " --metrics-out " + metrics, log);
  ASSERT_TRUE(wait_until([&] { return writing(ck, 5); }, 120)) << read_text(log);
  ::kill(pid, SIGTERM);
  EXPECT_EQ(wait_for_exit(pid), 143) << read_text(log);
  const std::string output = read_text(log);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(output, m, std::regex("ptrain: stopped by SIGTERM after step (\\d+) of 24"))) << output;
  const int64_t stopped_at = std::stoll(m[1]);
  // The write in flight when the signal came was finished, and so was the stop's own.
  EXPECT_TRUE(fs::exists(checkpoint(ck, 5))) << output;
  EXPECT_TRUE(fs::exists(checkpoint(ck, stopped_at))) << output;
  for (const auto& name : files_in(ck)) EXPECT_EQ(name.find(".tmp."), std::string::npos) << name;
  const Result verified = run("verify " + checkpoint(ck, 5) + " " + checkpoint(ck, stopped_at));
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
  const auto record = nlohmann::json::parse(std::ifstream(metrics));
  EXPECT_EQ(record["extra"]["run_end"]["checkpoint"], checkpoint(ck, stopped_at));
  // At least two writes held kDelayMs each; the stop waited for its own whole.
  EXPECT_GE(record["checkpoint_write_seconds"].get<double>(), 2 * kDelayMs / 1000.0) << record.dump();
  EXPECT_GE(record["checkpoint_blocking_seconds"].get<double>(), kDelayMs / 1000.0) << record.dump();
  ptrain::testing::remove_tree(dir);
}

TEST(RunEnd, AsyncCheckpointWithoutACheckpointDirIsAUsageError) {
  const Result r = run(run_of(1) + "--async-checkpoint");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("ptrain: error: --async-checkpoint needs --checkpoint-dir"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("epoch 1:"), std::string::npos) << "trained first: " << r.output;
}

}  // namespace
