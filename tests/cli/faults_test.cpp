// The ptrain command line under bad input and failing runs, as an adversarial user meets it: every failure is
// one line naming the thing, a non-zero exit, never an abort, and never after the training it could have saved.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "command.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;

using Result = ptrain::testing::CommandResult;

Result run_shell(const std::string& command_line) {
  return ptrain::testing::run_command("bash -c '" + command_line + "'");
}

Result run(const std::string& args) { return run_shell(std::string(PTRAIN_EXECUTABLE) + " " + args); }

fs::path scratch(const std::string& name) { return ptrain::testing::fresh_named_dir("faults_" + name); }

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

// --dry-run and estimate used to accept plans that train refused: a batch larger than the data, a cosine
// floor above the peak rate, a learning rate beyond a float. Each is refused the same way by all three.
TEST(CliFaults, DryRunAndEstimateRefuseWhatTrainRefuses) {
  const std::string data = "--model resnet20 --dataset synthetic --data-path 64:3x8x8:4 --device cpu --threads 1 ";
  const std::string train = "train " + data + "--progress none --test-limit 16 --warmup-epochs 0 --epochs 1 ";
  for (const auto& [args, why] : std::vector<std::pair<std::string, std::string>>{
           {"--batch-size 1000000000000 ", "--batch-size 1000000000000 x 1 replicas is larger than the 64 training samples"},
           {"--batch-size 16 --lr 0.1 --min-lr 0.5 ", "--min-lr 0.5 must not exceed --lr 0.1"},
           {"--batch-size 16 --lr 1e39 ", "--lr: must be at most 3.40282e+38 (the largest float), not 1e39"}}) {
    const Result trained = run(train + args);
    const Result dry = run(train + args + "--dry-run");
    const Result estimated = run("estimate " + data + args);
    for (const Result* r : {&trained, &dry, &estimated}) {
      expect_named_refusal(*r, why);
      EXPECT_EQ(r->output.find("epoch 1:"), std::string::npos) << args << "\n" << r->output;
    }
  }
}

// Settings of another optimizer or schedule were accepted and ignored (--momentum with adamw, --eps with sgd,
// --gamma with cosine, --min-lr with constant) while --milestones without --schedule step was refused.
TEST(CliFaults, OptimizerAndScheduleSettingsWithoutEffectAreRefusedByName) {
  const std::string dry = kTiny + "--dry-run ";
  expect_named_refusal(run(dry + "--optimizer adamw --momentum 0.5"), "--momentum applies to --optimizer sgd");
  expect_named_refusal(run(dry + "--optimizer adamw --nesterov"), "--nesterov applies to --optimizer sgd");
  expect_named_refusal(run(dry + "--eps 1e-6"), "--eps applies to --optimizer adamw (this run's optimizer is sgd)");
  expect_named_refusal(run(dry + "--beta1 0.8"), "--beta1 applies to --optimizer adamw");
  expect_named_refusal(run(dry + "--gamma 0.5"), "--gamma applies to --schedule step (this run's schedule is cosine)");
  expect_named_refusal(run(dry + "--schedule constant --min-lr 0.01"), "--min-lr applies to --schedule cosine");
  const Result fine = run(dry + "--optimizer adamw --eps 1e-6 --beta1 0.8 --schedule step --milestones 1 --gamma 0.5");
  EXPECT_EQ(fine.exit_code, 0) << fine.output;
}

// A 0-byte test_batch.bin gave "test accuracy -nan%" and exit 0.
TEST(CliFaults, AnEmptyTestSplitIsRefusedNamingItsFile) {
  const auto dir = scratch("empty_split");
  for (int i = 1; i <= 5; ++i)
    std::ofstream(dir / ("data_batch_" + std::to_string(i) + ".bin"), std::ios::binary) << std::string(3073 * 8, '\0');
  std::ofstream(dir / "test_batch.bin").close();
  const Result r = run("train --model resnet20 --dataset cifar10 --data-path " + dir.string() +
                       " --batch-size 8 --max-steps 1 --device cpu --threads 1 --progress none");
  expect_named_refusal(r, (dir / "test_batch.bin").string() + ": holds no CIFAR-10 records");
  EXPECT_EQ(r.output.find("nan"), std::string::npos) << r.output;
}

// A 16 GB file (sparse: it takes no disk) given to verify: its first bytes say it is no checkpoint. It was
// read whole first, which under a 6 GB address-space limit ended in std::bad_alloc.
TEST(CliFaults, VerifyRefusesAHugeFileFromItsHeaderWithoutReadingItWhole) {
  const auto dir = scratch("huge");
  const auto huge = (dir / "step-00000001.safetensors").string();
  { std::ofstream(huge).close(); }
  fs::resize_file(huge, 16ull << 30);
  const Result r = run_shell("ulimit -v 6000000; exec " + std::string(PTRAIN_EXECUTABLE) + " verify " + huge);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(huge + ": error: safetensors header is not valid JSON"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("bad_alloc"), std::string::npos) << r.output;
}

// A link at --metrics-out (a results folder's "latest.json") was replaced by a plain file.
TEST(CliFaults, ALinkAtMetricsOutIsKeptAndItsTargetWritten) {
  const auto dir = scratch("metrics_link");
  fs::create_directories(dir / "results");
  std::ofstream(dir / "results" / "run.json") << "{}";
  fs::create_symlink("results/run.json", dir / "latest.json");
  const Result r = run(kTiny + "--max-steps 1 --metrics-out " + (dir / "latest.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::is_symlink(dir / "latest.json"));
  const auto json = nlohmann::json::parse(std::ifstream(dir / "results" / "run.json"));
  EXPECT_EQ(json["steps"], 1) << json.dump();
}

// `ptrain train > log` with --metrics-out /dev/stdout replaced the log with the record alone, and
// --log-jsonl /dev/stdout truncated it and wrote over its lines: both go to the end of the log now.
TEST(CliFaults, StdoutAsAnOutputAppendsToTheRedirectedLog) {
  const auto dir = scratch("stdout");
  const auto log = (dir / "log").string();
  const Result r = run_shell(std::string(PTRAIN_EXECUTABLE) + " " + kTiny +
                             "--max-steps 2 --log-every 1 --metrics-out /dev/stdout --log-jsonl /dev/stdout > " + log);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto result = text.find("result:"), first_line = text.find("{\"kind\":\"step\",\"step\":1,"),
             record = text.find("\"steps\": 2"), written = text.find("metrics written to /dev/stdout");
  ASSERT_NE(first_line, std::string::npos) << text;
  EXPECT_NE(text.find("{\"kind\":\"step\",\"step\":2,"), std::string::npos) << text;
  ASSERT_NE(result, std::string::npos) << text;
  ASSERT_NE(record, std::string::npos) << text;
  ASSERT_NE(written, std::string::npos) << text;
  EXPECT_LT(first_line, result) << text;
  EXPECT_LT(result, record) << text;
  EXPECT_LT(record, written) << text;
}

// Outputs that only an attempt shows unwritable (/proc takes no files, even from root) were found out after
// estimate's probe runs; and bench's --out is checked before the suite is read.
TEST(CliFaults, EstimateAndBenchOutputsAreCheckedBeforeAnyWork) {
  const auto dir = scratch("estimate_out");
  const Result estimated =
      run("estimate --model resnet20 --dataset synthetic --data-path 64:3x8x8:4 --batch-size 16 --json /proc/e.json");
  expect_named_refusal(estimated, "--json /proc/e.json: cannot be created in /proc (");
  EXPECT_EQ(std::count(estimated.output.begin(), estimated.output.end(), '\n'), 1) << estimated.output;
  std::ofstream(dir / "a-file") << "x";
  const Result bench = run("bench --suite no-such-suite --out " + (dir / "a-file" / "out").string());
  expect_named_refusal(bench, "--out " + (dir / "a-file" / "out").string() + ": cannot be created, " +
                                  (dir / "a-file").string() + " is a file, not a directory");
}

}  // namespace
