// The ptrain command line under bad input and failing runs, as an adversarial user meets it: every failure is
// one line naming the thing, a non-zero exit, never an abort, and never after the training it could have saved.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "remove_tree.h"

namespace {

namespace fs = std::filesystem;

struct Result {
  int exit_code;
  std::string output;
  double seconds;
};

Result run_shell(const std::string& command_line) {
  const std::string command = "bash -c '" + command_line + "' 2>&1";
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  std::array<char, 4096> buffer{};
  while (size_t n = fread(buffer.data(), 1, buffer.size(), pipe)) output.append(buffer.data(), n);
  const int status = pclose(pipe);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), output, seconds};
}

Result run(const std::string& args) { return run_shell(std::string(PTRAIN_EXECUTABLE) + " " + args); }

fs::path scratch(const std::string& name) {
  auto dir = fs::temp_directory_path() / ("ptrain_faults_" + name + "_" + std::to_string(::getpid()));
  ptrain::testing::remove_tree(dir);
  fs::create_directories(dir);
  return dir;
}

// 4 steps of resnet20 on 8x8 images: a second or two.
const std::string kTinyWithoutEpochs =
    "train --model resnet20 --dataset synthetic --data-path 64:3x8x8:4 --batch-size 16 --device cpu "
    "--threads 1 --progress none --test-limit 16 --warmup-epochs 0 ";
const std::string kTiny = kTinyWithoutEpochs + "--epochs 1 ";

// Refused the way the user must see it: exit 2, one error line that names `what`, no abort.
void expect_named_refusal(const Result& r, const std::string& what) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("ptrain: error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(what), std::string::npos) << what << "\n" << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
}

TEST(CliFaults, OutputPathsThatCannotBeWrittenAreRefusedBeforeTraining) {
  const auto dir = scratch("outputs");
  const auto file = (dir / "a-file").string();
  std::ofstream(file) << "x";
  for (const auto& args : {"--checkpoint-dir " + file, "--checkpoint-dir " + file + "/sub",
                           "--metrics-out " + file + "/m.json", "--metrics-out " + dir.string()}) {
    const Result r = run(kTiny + args);
    expect_named_refusal(r, file.substr(0, file.size() - 7));
    EXPECT_EQ(r.output.find("epoch 1:"), std::string::npos) << "trained first: " << r.output;
    EXPECT_EQ(r.output.find("result:"), std::string::npos) << r.output;
  }
  expect_named_refusal(run("estimate --model resnet20 --dataset synthetic --json " + file + "/e.json"), file);
}

TEST(CliFaults, ACheckpointNameWithAnAbsurdStepIsNamed) {
  const auto dir = scratch("absurd");
  const auto absurd = (dir / "step-99999999999999999999999.safetensors").string();
  std::ofstream(absurd) << "x";
  expect_named_refusal(run(kTiny + "--checkpoint-dir " + dir.string() + " --resume latest"), absurd);
}

TEST(CliFaults, NonFiniteAndOverflowingNumbersAreRefused) {
  for (const char* flag : {"--momentum nan", "--weight-decay nan", "--lr nan", "--lr 1e999"}) {
    const Result r = run(kTiny + flag);
    EXPECT_NE(r.exit_code, 0) << flag << "\n" << r.output;
    EXPECT_NE(r.output.find(std::string(flag).substr(0, std::string(flag).find(' '))), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("not a finite number"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("--min-lr"), std::string::npos) << r.output;
  }
  expect_named_refusal(run(kTinyWithoutEpochs + "--epochs 9223372036854775807"), "--epochs 9223372036854775807");
  const Result seed = run(kTiny + "--seed -1");
  EXPECT_NE(seed.exit_code, 0) << seed.output;
  EXPECT_NE(seed.output.find("--seed"), std::string::npos) << seed.output;
  const Result range = run(kTiny + "--lr -1");
  EXPECT_NE(range.output.find("must be greater than 0, not -1"), std::string::npos) << range.output;
  EXPECT_EQ(range.output.find("179769313486"), std::string::npos) << "DBL_MAX in full: " << range.output;
}

TEST(CliFaults, FlagsThatWouldDoNothingAreRefusedByName) {
  const std::string dry = kTiny + "--dry-run ";
  expect_named_refusal(run(dry + "--strategy zero2 --bucket-cap-mb 50"), "--bucket-cap-mb");
  expect_named_refusal(run(dry + "--strategy ddp --reduce-bucket-mb 50"), "--reduce-bucket-mb");
  expect_named_refusal(run(dry + "--strategy zero3 --reduce-bucket-mb 50"), "--reduce-bucket-mb");
  expect_named_refusal(run(dry + "--reduce-dtype bf16"), "--reduce-dtype");
  expect_named_refusal(run(dry + "--strategy zero1 --allgather-bucket-mb 100"), "--allgather-bucket-mb");
  expect_named_refusal(run(dry + "--strategy zero2 --no-contiguous-gradients"), "--no-contiguous-gradients");
  expect_named_refusal(run(dry + "--no-overlap-comm"), "--no-overlap-comm");
  EXPECT_EQ(run(dry + "--strategy ddp --reduce-dtype bf16 --no-overlap-comm --bucket-cap-mb 50").exit_code, 0);
}

TEST(CliFaults, ATrainingCheckpointGivenAsWeightsGetsAOneLineHint) {
  const auto dir = scratch("weights");
  ASSERT_EQ(run(kTiny + "--max-steps 1 --checkpoint-dir " + dir.string()).exit_code, 0);
  const auto checkpoint = (dir / "step-00000001.safetensors").string();
  const Result r = run(kTiny + "--max-steps 1 --weights " + checkpoint);
  expect_named_refusal(r, "it is a ptrain training checkpoint, not a weights file: continue it with --resume " + checkpoint);
  EXPECT_EQ(r.output.find("missing key"), std::string::npos) << r.output;
}

// 2e11 samples: their labels alone (1.6 TB) cannot be allocated, which ulimit -v makes certain whatever the
// kernel's overcommit policy, so nothing is ever touched.
TEST(CliFaults, OutOfMemoryWhileLoadingTheDataGetsDataAdvice) {
  const Result r = run_shell("ulimit -v 16000000; exec " + std::string(PTRAIN_EXECUTABLE) +
                             " train --model resnet20 --dataset synthetic --data-path 200000000000:3x8x8:10 --device cpu "
                             "--max-steps 1 --progress none");
  expect_named_refusal(r, "out of host memory while loading the data");
  EXPECT_NE(r.output.find("--train-limit"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("--strategy zero3"), std::string::npos) << "model-state advice: " << r.output;
}

TEST(CliFaults, ImageFoldersWithDifferentClassesAreRefusedNamingBoth) {
  const auto dir = scratch("classes");
  const std::string make = std::string(PTRAIN_ORACLE_PYTHON) + " " + PTRAIN_SOURCE_DIR + "/tests/oracles/data_image_folder.py make ";
  ASSERT_EQ(std::system((make + (dir / "train").string()).c_str()), 0);
  ASSERT_EQ(std::system((make + (dir / "test").string()).c_str()), 0);
  fs::remove_all(dir / "test" / "mole");  // classes ant, zebra: the labels of zebra would shift by one
  const Result r = run("train --model resnet20 --dataset imagefolder --data-path " + dir.string() +
                       " --batch-size 2 --max-steps 1 --device cpu --progress none");
  expect_named_refusal(r, (dir / "train").string());
  EXPECT_NE(r.output.find((dir / "test").string() + " lacks 'mole'"), std::string::npos) << r.output;
}

// --on-divergence warn trains on, records the step, saves no NaN checkpoint and still exits non-zero.
TEST(CliFaults, ADivergedRunNeverExitsZero) {
  const auto dir = scratch("diverged");
  const auto metrics = (dir / "run.json").string();
  const Result stop = run(kTiny + "--lr 1e6 --checkpoint-dir " + (dir / "stop").string());
  expect_named_refusal(stop, "training diverged at step ");
  const Result warn = run(kTiny + "--lr 1e6 --on-divergence warn --metrics-out " + metrics + " --checkpoint-dir " +
                          (dir / "warn").string());
  expect_named_refusal(warn, "training diverged at step ");
  const auto json = nlohmann::json::parse(std::ifstream(metrics));
  EXPECT_TRUE(json["diverged_at_step"].is_number_integer()) << json.dump();
  // The directory holds the run's lock file, and no checkpoint.
  for (const auto& entry : fs::directory_iterator(dir / "warn"))
    EXPECT_EQ(entry.path().filename(), ".ptrain.lock") << "a NaN checkpoint was saved";
}

}  // namespace
