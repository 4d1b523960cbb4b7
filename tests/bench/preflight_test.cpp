// The bench makes every run's plan before the first one starts: a run that cannot train is named with the
// reason in seconds, and a bench of nothing but such runs starts none of them.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ptrain/bench/preflight.h"
#include "ptrain/bench/runner.h"
#include "ptrain/bench/suite.h"
#include "ptrain/core/error.h"
#include "ptrain/train/plan.h"
#include "ptrain/train/trainer.h"
#include "test_support.h"

namespace ptrain::bench {
namespace {

namespace fs = std::filesystem;
using ptrain::testing::TempDir;
using estimate::run_length;
using estimate::RunLength;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& text, const std::string& word) { return text.find(word) != std::string::npos; }

BenchOptions cpu_bench(const std::string& suite, const std::string& out) {
  BenchOptions o;
  o.suite = suite;
  o.source_dir = PTRAIN_SOURCE_DIR;
  o.out_dir = out;
  o.gpus = 0;
  o.estimate = false;
  // Never started: a run that started would fail on it, and the bench would go on instead of stopping.
  o.ptrain_executable = "/nonexistent/ptrain";
  return o;
}

// The trainer's own count is the oracle: steps a tiny in-process run trains, against what the bench predicts
// for it, over epochs, --max-steps, accumulation and dp replicas.
TEST(RunLength, CountsTheStepsTheTrainerTrains) {
  struct Case {
    std::vector<std::string> flags;
    int64_t replicas;
  };
  for (const Case& shape : {Case{{"--epochs", "2"}, 1}, Case{{"--epochs", "3", "--max-steps", "7"}, 1},
                            Case{{"--epochs", "1", "--grad-accum", "2"}, 1},
                            Case{{"--epochs", "1", "--strategy", "dp", "--replicas", "2"}, 2}}) {
    std::vector<std::string> arguments{"--model", "resnet20", "--dataset", "synthetic", "--data-path", "100:1x8x8:4",
                                       "--batch-size", "6", "--test-limit", "8", "--threads", "1", "--progress",
                                       "none", "--device", "cpu", "--no-eval-each-epoch"};
    arguments.insert(arguments.end(), shape.flags.begin(), shape.flags.end());
    const config::TrainConfig config = train_config_of(arguments, 1);
    const train::Plan plan = train::make_plan(config);
    const RunLength predicted = run_length(plan.length, plan.optimization.schedule, 100, 1, shape.replicas);
    const metrics::RunRecord trained = train::train(plan, "preflight_test");
    EXPECT_EQ(predicted.total_steps, trained.steps) << ::testing::PrintToString(shape.flags);
  }
}

// ptrain bench --suite standard --set max-steps=60 on an H200: CIFAR-10's 50,000 training images in batches of
// 128 are 390 steps an epoch, so the suite's 0.5-epoch warm-up is 195 steps, longer than 60. Every run failed
// after 12-15 s of setting up; the bench's check says so before any starts.
TEST(RunLength, TheStandardWarmUpIsLongerThanSixtySteps) {
  TempDir dir;
  const Suite standard = load_suite("standard", PTRAIN_SOURCE_DIR, 1);
  std::ofstream workload(dir.file("workload.yaml"));
  for (const auto& [key, value] : standard.workload) workload << key << ": " << value << "\n";
  workload.close();
  config::TrainConfig c = train_config_of({"--config", dir.file("workload.yaml"), "--max-steps", "60"}, 1);
  const auto length_on = [&c](int64_t samples) {
    return run_length(train::run_length_of(c), train::schedule_options(c.optim), samples, 1, 1);
  };
  const std::string why = error_of([&] { length_on(50000); });
  EXPECT_TRUE(has(why, "--warmup-epochs 0.5 is 195 optimizer steps (390 an epoch)")) << why;
  EXPECT_TRUE(has(why, "longer than the whole run of 60 steps (--max-steps 60)")) << why;
  c.run.max_steps = 0;
  const RunLength full = length_on(50000);
  EXPECT_EQ(full.total_steps, 5 * 390) << "the suite as written trains its 5 epochs";
  EXPECT_EQ(full.warmup_steps, 195);
  EXPECT_TRUE(has(error_of([&] { length_on(100); }), "larger than the 100 training samples"));
}

TEST(Preflight, AnImpossibleWorkloadStopsTheBenchBeforeItsFirstRunNamingRunAndKey) {
  TempDir dir;
  // The standard suite without a GPU trains Fashion-MNIST (60,000 images, batch 32: 1875 steps an epoch) for
  // 20 steps; half an epoch of warm-up is 938 steps.
  BenchOptions o = cpu_bench("standard", dir.file("out"));
  o.overrides = {{"warmup-epochs", "0.5"}};
  const auto started = std::chrono::steady_clock::now();
  std::ostringstream progress;
  const std::string why = error_of([&] { run_bench(o, progress); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_LT(seconds, 20) << "the check reads the data once and trains nothing";
  EXPECT_TRUE(has(why, "ptrain fp32-single-x1")) << why;
  EXPECT_TRUE(has(why, "--warmup-epochs 0.5 is 938 optimizer steps (1875 an epoch)")) << why;
  EXPECT_TRUE(has(why, "(--max-steps 20)")) << why;
  EXPECT_TRUE(has(why, "no run started")) << why;
  EXPECT_EQ(progress.str(), "") << "no run was announced";
  EXPECT_FALSE(fs::exists(dir.file("out/logs")));
  EXPECT_FALSE(fs::exists(dir.file("out/runs")));
  EXPECT_FALSE(fs::exists(dir.file("out/bench.json"))) << "a later bench with the workload fixed must not be refused";
}

TEST(Preflight, MakePlansRefusalNamesTheRunAndTheFlag) {
  TempDir dir;
  std::ofstream(dir.file("suite.yaml")) << R"(name: refused
workload: {model: resnet20, dataset: synthetic, data-path: "64:1x8x8:4", batch-size: 8, global-batch-size: 25, epochs: 1}
runs:
  - {precision: fp32, strategy: ddp, devices: 2}
)";
  const std::string why = error_of([&] {
    std::ostringstream progress;
    run_bench(cpu_bench(dir.file("suite.yaml"), dir.file("out")), progress);
  });
  // Made as rank 0 of the run's two processes makes it: the world divides the global batch.
  EXPECT_TRUE(has(why, "ptrain fp32-ddp-x2: --global-batch-size 25 is not divisible by 2 devices")) << why;
  EXPECT_EQ(std::getenv("WORLD_SIZE"), nullptr) << "the launch environment of the check is put back";
  EXPECT_EQ(std::getenv("RANK"), nullptr);
}

// Beside runs that can train, one that cannot is failed at once with its reason (and a log saying so) and
// never started; the others start.
TEST(Preflight, ARunThatCannotTrainBesideOthersFailsAtOnceAndTheOthersStart) {
  TempDir dir;
  std::ofstream(dir.file("suite-bad.yaml")) << R"(name: mixed
workload: {model: resnet20, dataset: synthetic, data-path: "64:1x8x8:4", batch-size: 40, epochs: 1}
runs:
  - {precision: fp32, strategy: dp, devices: 2}
  - {precision: fp32}
)";
  BenchOptions o = cpu_bench(dir.file("suite-bad.yaml"), dir.file("out"));
  o.ptrain_executable = "/bin/true";  // starts, and writes no record
  std::ostringstream progress;
  const BenchOutcome outcome = run_bench(o, progress);
  ASSERT_EQ(outcome.failures.size(), 2u) << progress.str();
  EXPECT_EQ(outcome.failures[0],
            "ptrain fp32, dp, 2 devices: cannot train: --batch-size 40 x 2 replicas is larger than the 64 training "
            "samples");
  EXPECT_TRUE(has(outcome.failures[1], "exited without writing")) << outcome.failures[1];
  EXPECT_TRUE(has(progress.str(), "[1/2] ptrain fp32, dp, 2 devices: FAILED before starting (cannot train:"))
      << progress.str();
  std::ifstream log(dir.file("out/logs/ptrain-fp32-dp-x2.log"));
  std::string line;
  std::getline(log, line);
  EXPECT_TRUE(has(line, "not started: cannot train: --batch-size 40")) << line;
}

// A run whose estimate fails still runs, but the bench counts the estimate and names its error: a bench of
// failed estimates does not read as one with none.
TEST(Preflight, FailedEstimatesAreCountedAndNamed) {
  TempDir dir;
  std::ofstream(dir.file("suite.yaml")) << R"(name: estimates
workload: {model: resnet20, dataset: synthetic, data-path: "64:1x8x8:4", batch-size: 8, epochs: 1}
runs:
  - {precision: fp32}
  - {precision: bf16}
)";
  // Its estimate fails as ptrain's does, its training exits without a record.
  const std::string fake = dir.file("ptrain");
  std::ofstream(fake) << "#!/bin/sh\n"
                         "if [ \"$1\" = estimate ]; then echo 'ptrain: error: the probe broke' >&2; exit 2; fi\n"
                         "exit 0\n";
  fs::permissions(fake, fs::perms::owner_all);
  BenchOptions o = cpu_bench(dir.file("suite.yaml"), dir.file("out"));
  o.estimate = true;
  o.ptrain_executable = fake;
  std::ostringstream progress;
  const BenchOutcome outcome = run_bench(o, progress);
  EXPECT_EQ(outcome.estimates_failed, 2) << progress.str();
  ASSERT_EQ(outcome.estimate_failures.size(), 2u) << progress.str();
  EXPECT_EQ(outcome.estimate_failures[0], "fp32, single, 1 device: the probe broke");
  EXPECT_TRUE(has(progress.str(), "estimate FAILED (the probe broke): no prediction for this run")) << progress.str();
}

// A Python that cannot run the PyTorch reference stops bench --pytorch before any run, in one error naming it
// and what it lacks, rather than failing each PyTorch run in turn after ptrain's.
TEST(Preflight, APythonLackingWhatTheReferenceImportsStopsTheBenchBeforeAnyRun) {
  TempDir dir;
  std::ofstream(dir.file("suite.yaml")) << R"(name: tiny
workload: {model: resnet20, dataset: synthetic, data-path: "64:1x8x8:4", batch-size: 8, epochs: 1}
runs:
  - {precision: fp32}
)";
  const std::string python = dir.file("python3");
  std::ofstream(python) << "#!/bin/sh\n"
                           "echo 'Traceback (most recent call last):'\n"
                           "echo \"ModuleNotFoundError: No module named 'numpy'\"\n"
                           "exit 1\n";
  fs::permissions(python, fs::perms::owner_all);
  BenchOptions o = cpu_bench(dir.file("suite.yaml"), dir.file("out"));
  o.pytorch = true;
  o.python = python;
  std::ostringstream progress;
  const std::string message = ptrain::testing::error_message<Error>([&] { run_bench(o, progress); });
  EXPECT_TRUE(has(message, "--pytorch: " + python + " cannot import torch, torchvision and numpy: "
                           "ModuleNotFoundError: No module named 'numpy'")) << message;
  EXPECT_TRUE(has(message, "--python")) << message;
  EXPECT_TRUE(has(message, "no run started")) << message;
  EXPECT_FALSE(fs::exists(dir.file("out"))) << "nothing written before the check";
}

}  // namespace
}  // namespace ptrain::bench
