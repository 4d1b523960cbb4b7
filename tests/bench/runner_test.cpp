// The bench's jobs: which processes a suite starts and with which command lines, for ptrain and for each
// PyTorch variant; the processes themselves run in tests/cli.
#include <gtest/gtest.h>

#include <cstdio>
#include <algorithm>
#include <fstream>
#include <regex>
#include <sstream>

#include "ptrain/bench/bench_record.h"
#include "ptrain/bench/command_process.h"
#include "ptrain/bench/duration.h"
#include "ptrain/bench/jobs.h"
#include "ptrain/bench/runner.h"
#include "ptrain/bench/suite.h"
#include "ptrain/config/train_config.h"
#include "ptrain/core/error.h"
#include "ptrain/metrics/run_record.h"
#include "command.h"
#include "test_support.h"

namespace ptrain::bench {
namespace {

using ptrain::testing::TempDir;

const char* kSuite = R"(name: speedy
workloads:
  resnet: {model: resnet50, dataset: cifar10, data-path: .data/cifar10, image-size: 224, batch-size: 128,
           channels-last: true, train-limit: 3840, max-steps: 30}
  gpt: {model: gpt-small, dataset: synthetic-tokens, data-path: "480:1024:50257", batch-size: 16, optimizer: adamw,
        lr: 6e-4, warmup-steps: 5, max-steps: 30}
  clipped: {model: resnet20, clip-grad-norm: 1.0}
runs:
  - {workload: resnet, precision: amp-bf16, pytorch: [eager, compiled]}
  - {workload: gpt, precision: amp-bf16, pytorch: [eager, compiled]}
  - {workload: gpt, precision: fp32}
  - {workload: gpt, precision: fp32, ptrain: false, pytorch: compiled}
  - {workload: clipped, precision: fp32}
)";

BenchOptions options() {
  BenchOptions o;
  o.pytorch = true;
  o.estimate = false;
  o.python = "python3";
  o.source_dir = "/src";
  o.ptrain_executable = "/bin/ptrain";
  return o;
}

PytorchAbilities torch2() {
  PytorchAbilities a;
  a.known = true;
  a.torch_version = "2.11.0";
  a.has_compile = true;
  return a;
}

bool has(const std::string& command, const std::string& word) { return command.find(word) != std::string::npos; }

const BenchJob& job_of(const std::vector<BenchJob>& jobs, const std::string& framework, const std::string& id) {
  for (const auto& job : jobs) {
    if (job.framework == framework && job.run.id() == id) return job;
  }
  throw std::runtime_error("no job " + framework + "/" + id);
}

class Jobs : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("suite.yaml");
    std::ofstream(path_) << kSuite;
  }
  std::vector<BenchJob> plan(const BenchOptions& o, const PytorchAbilities& pytorch = torch2()) {
    return plan_jobs(load_suite(path_, "/nonexistent", 1), o, "/out", pytorch);
  }

  TempDir dir_;
  std::string path_;
};

TEST_F(Jobs, EachRunEntryGivesPtrainThenItsPytorchVariantsInOrder) {
  const auto jobs = plan(options());
  std::vector<std::string> order;
  for (const auto& job : jobs) order.push_back(job.framework + "/" + job.run.id());
  EXPECT_EQ(order, (std::vector<std::string>{"ptrain/resnet/amp-bf16-single-x1", "pytorch/resnet/amp-bf16-single-x1",
                                             "pytorch-compiled/resnet/amp-bf16-single-x1", "ptrain/gpt/amp-bf16-single-x1",
                                             "pytorch/gpt/amp-bf16-single-x1", "pytorch-compiled/gpt/amp-bf16-single-x1",
                                             "ptrain/gpt/fp32-single-x1", "pytorch/gpt/fp32-single-x1",
                                             "pytorch-compiled/gpt/fp32-single-x1", "ptrain/clipped/fp32-single-x1",
                                             "pytorch/clipped/fp32-single-x1"}));
  BenchOptions without = options();
  without.pytorch = false;
  EXPECT_EQ(plan(without).size(), 4u) << "without --pytorch only ptrain's runs";
}

TEST_F(Jobs, PtrainTrainsEachWorkloadFromItsOwnConfigAndKeepsFilesPerWorkload) {
  const auto jobs = plan(options());
  const BenchJob& job = job_of(jobs, "ptrain", "gpt/amp-bf16-single-x1");
  EXPECT_TRUE(has(job.command, "'/bin/ptrain' 'train' '--config' '/out/workloads/gpt.yaml' '--precision' 'amp-bf16'"))
      << job.command;
  EXPECT_EQ(job.metrics_path, "/out/runs/ptrain/gpt/amp-bf16-single-x1.json");
  EXPECT_EQ(job.log_path, "/out/logs/gpt/ptrain-amp-bf16-single-x1.log");
  // The run logs its steps beside its record, where the report finds them for its curves.
  EXPECT_TRUE(has(job.command, "'--metrics-out' '/out/runs/ptrain/gpt/amp-bf16-single-x1.json' "
                               "'--log-jsonl' '/out/runs/ptrain/gpt/amp-bf16-single-x1.log.jsonl'"))
      << job.command;
  EXPECT_TRUE(job.unavailable.empty());
  BenchOptions estimating = options();
  estimating.estimate = true;
  const auto estimated_jobs = plan(estimating);
  const BenchJob& estimated = job_of(estimated_jobs, "ptrain", "gpt/amp-bf16-single-x1");
  EXPECT_EQ(estimated.estimate_path, "/out/estimates/gpt/amp-bf16-single-x1.json");
  EXPECT_TRUE(has(estimated.command, "'mkdir' '-p' '/out/estimates/gpt'")) << estimated.command;
}

TEST_F(Jobs, EagerIsTheClassicPathInPtrainsMemoryFormat) {
  const auto jobs = plan(options());
  const BenchJob& resnet = job_of(jobs, "pytorch", "resnet/amp-bf16-single-x1");
  EXPECT_EQ(resnet.metrics_path, "/out/runs/pytorch/resnet/amp-bf16-single-x1.json");
  EXPECT_EQ(resnet.log_path, "/out/logs/resnet/pytorch-amp-bf16-single-x1.log");
  EXPECT_EQ(resnet.command.rfind("'python3' '/src/bench/pytorch_reference.py' '--precision' 'amp-bf16'", 0), 0u)
      << resnet.command;
  for (const char* word : {"'--channels-last'", "'--train-limit' '3840'", "'--max-steps' '30'", "'--optimizer' 'sgd'",
                           "'--momentum' '0.9'", "'--weight-decay' '0.0005'", "'--schedule' 'cosine'",
                           "'--cache-dir' '/out/pytorch-cache'"}) {
    EXPECT_TRUE(has(resnet.command, word)) << word << " in " << resnet.command;
  }
  for (const char* word : {"--compile", "--fused-optimizer", "TORCHINDUCTOR"}) {
    EXPECT_FALSE(has(resnet.command, word)) << word << " in " << resnet.command;
  }
  const BenchJob& gpt = job_of(jobs, "pytorch", "gpt/amp-bf16-single-x1");
  for (const char* word : {"'--model' 'gpt-small'", "'--dataset' 'synthetic-tokens'", "'--data' '480:1024:50257'",
                           "'--optimizer' 'adamw'", "'--lr' '6e-4'", "'--warmup-steps' '5'", "'--beta2' '0.999'",
                           "'--eps' '1e-08'"}) {
    EXPECT_TRUE(has(gpt.command, word)) << word << " in " << gpt.command;
  }
  EXPECT_FALSE(has(gpt.command, "--channels-last")) << "a GPT has no convolutions: " << gpt.command;
}

TEST_F(Jobs, CompiledIsTorchCompileWithChannelsLastAndTheFusedOptimizerSharingOneInductorCache) {
  const auto jobs = plan(options());
  const BenchJob& resnet = job_of(jobs, "pytorch-compiled", "resnet/amp-bf16-single-x1");
  EXPECT_EQ(resnet.metrics_path, "/out/runs/pytorch-compiled/resnet/amp-bf16-single-x1.json");
  EXPECT_EQ(resnet.log_path, "/out/logs/resnet/pytorch-compiled-amp-bf16-single-x1.log");
  EXPECT_EQ(resnet.command.rfind("'env' 'TORCHINDUCTOR_CACHE_DIR=/out/pytorch-cache/inductor' 'python3' ", 0), 0u)
      << resnet.command;
  for (const char* word : {"'--compile'", "'--fused-optimizer'", "'--channels-last'"}) {
    EXPECT_TRUE(has(resnet.command, word)) << word << " in " << resnet.command;
  }
  const BenchJob& gpt = job_of(jobs, "pytorch-compiled", "gpt/fp32-single-x1");
  EXPECT_TRUE(has(gpt.command, "'--compile' '--fused-optimizer'")) << gpt.command;
  EXPECT_FALSE(has(gpt.command, "--channels-last")) << gpt.command;
  EXPECT_TRUE(has(gpt.command, "'--compile-mode' 'default'")) << "the job names its mode: " << gpt.command;
  EXPECT_EQ(gpt.compile_mode, "default");
  EXPECT_TRUE(gpt.unavailable.empty());
}

// compiled-MODE beside compiled: a job of its own, with its own record and log, the same inductor cache.
TEST_F(Jobs, EachCompileModeIsAJobOfItsOwnWithItsOwnFilesAndOneInductorCache) {
  std::ofstream(path_) << "pytorch-compile-mode: reduce-overhead\n"
                       << kSuite << "  - {workload: resnet, precision: amp-bf16, ptrain: false, pytorch: compiled-default}\n";
  const auto jobs = plan(options());
  const BenchJob& graphs = job_of(jobs, "pytorch-compiled", "resnet/amp-bf16-single-x1");
  const BenchJob& plain = job_of(jobs, "pytorch-compiled-default", "resnet/amp-bf16-single-x1");
  EXPECT_EQ(graphs.compile_mode, "reduce-overhead");
  EXPECT_EQ(plain.compile_mode, "default");
  EXPECT_TRUE(has(graphs.command, "'--compile' '--fused-optimizer' '--compile-mode' 'reduce-overhead'")) << graphs.command;
  EXPECT_TRUE(has(plain.command, "'--compile' '--fused-optimizer' '--compile-mode' 'default'")) << plain.command;
  EXPECT_EQ(graphs.metrics_path, "/out/runs/pytorch-compiled/resnet/amp-bf16-single-x1.json");
  EXPECT_EQ(plain.metrics_path, "/out/runs/pytorch-compiled-default/resnet/amp-bf16-single-x1.json");
  EXPECT_EQ(plain.log_path, "/out/logs/resnet/pytorch-compiled-default-amp-bf16-single-x1.log");
  EXPECT_NE(plain.log_path, graphs.log_path);
  for (const auto* job : {&graphs, &plain}) {
    EXPECT_EQ(job->command.rfind("'env' 'TORCHINDUCTOR_CACHE_DIR=/out/pytorch-cache/inductor' 'python3' ", 0), 0u)
        << job->command;
    EXPECT_TRUE(job->unavailable.empty()) << job->unavailable;
  }
  EXPECT_EQ(job_of(jobs, "pytorch", "resnet/amp-bf16-single-x1").compile_mode, "");
}

// A record left by a bench in another compile mode (the suite's pytorch-compile-mode changed) is not this
// job's: it runs again instead of passing for a run done earlier.
TEST(FinishedRecord, OfACompiledJobMustBeOfItsCompileMode) {
  TempDir dir;
  metrics::RunRecord record;
  record.framework = metrics::kFrameworkPytorch;
  record.compiled = true;
  record.extra["compile"] = {{"mode", "default"}};
  BenchJob job;
  job.metrics_path = dir.file("record.json");
  metrics::write_run_record(job.metrics_path, record);
  job.compile_mode = "default";
  EXPECT_TRUE(finished_record(job).has_value());
  job.compile_mode = "reduce-overhead";
  EXPECT_FALSE(finished_record(job).has_value());
  record.extra.erase("compile");  // an older record: the default mode
  metrics::write_run_record(job.metrics_path, record);
  EXPECT_FALSE(finished_record(job).has_value());
  job.compile_mode = "default";
  EXPECT_TRUE(finished_record(job).has_value());
  job.compile_mode.clear();  // an eager job
  EXPECT_TRUE(finished_record(job).has_value());
}

// A batch-size sweep: each run trains its workload at its own batch, train-limit scaled so that the run keeps
// its steps, ptrain (and its estimate) by flags over the workload file, PyTorch by its own flags.
TEST_F(Jobs, ARunOfItsOwnBatchSizeTrainsItInEveryFrameworkWithTrainLimitScaled) {
  std::ofstream(path_) << kSuite << "  - {workload: resnet, precision: amp-bf16, batch-size: 400, pytorch: [eager, compiled]}\n";
  BenchOptions estimating = options();
  estimating.estimate = true;
  const auto jobs = plan(estimating);
  const BenchJob& ptrain = job_of(jobs, "ptrain", "resnet/amp-bf16-single-x1-b400");
  EXPECT_EQ(ptrain.metrics_path, "/out/runs/ptrain/resnet/amp-bf16-single-x1-b400.json");
  EXPECT_EQ(ptrain.log_path, "/out/logs/resnet/ptrain-amp-bf16-single-x1-b400.log");
  EXPECT_EQ(ptrain.estimate_path, "/out/estimates/resnet/amp-bf16-single-x1-b400.json");
  const auto train_at = ptrain.command.find("'train' '--config' '/out/workloads/resnet.yaml'");
  ASSERT_NE(train_at, std::string::npos) << ptrain.command;
  EXPECT_TRUE(has(ptrain.command.substr(train_at), "'--batch-size' '400' '--train-limit' '12000'")) << ptrain.command;
  const auto estimate_at = ptrain.command.find("'estimate'");
  ASSERT_NE(estimate_at, std::string::npos);
  EXPECT_TRUE(has(ptrain.command.substr(estimate_at, train_at - estimate_at), "'--batch-size' '400'")) << ptrain.command;
  EXPECT_NE(std::find(ptrain.train_arguments.begin(), ptrain.train_arguments.end(), "12000"),
            ptrain.train_arguments.end())
      << "the preflight checks the run it will train";
  for (const char* framework : {"pytorch", "pytorch-compiled"}) {
    const BenchJob& job = job_of(jobs, framework, "resnet/amp-bf16-single-x1-b400");
    EXPECT_EQ(job.metrics_path, std::string("/out/runs/") + framework + "/resnet/amp-bf16-single-x1-b400.json");
    EXPECT_TRUE(has(job.command, "'--batch-size' '400'")) << job.command;
    EXPECT_TRUE(has(job.command, "'--train-limit' '12000'")) << job.command;
    EXPECT_FALSE(has(job.command, "'--batch-size' '128'")) << job.command;
  }
  const BenchJob& base = job_of(jobs, "ptrain", "resnet/amp-bf16-single-x1");
  EXPECT_FALSE(has(base.command, "--batch-size")) << "the workload's own batch comes from its file: " << base.command;
  EXPECT_TRUE(has(job_of(jobs, "pytorch", "resnet/amp-bf16-single-x1").command, "'--train-limit' '3840'"));
}

// A run's fp8 flags reach ptrain's train and estimate; PyTorch's reference, whose fp8 is torchao's recipe only,
// is unavailable for them with the reason, and runs the recipe it has.
TEST_F(Jobs, Fp8FlagsReachPtrainAndLeaveTheReferenceUnavailable) {
  std::ofstream(path_) << kSuite << "  - {workload: gpt, precision: fp8, pytorch: compiled}\n"
                       << "  - {workload: gpt, precision: fp8, fp8-scaling: delayed, fp8-head: true, pytorch: compiled}\n"
                       << "  - {workload: gpt, precision: fp8, fp8-head: true}\n";
  BenchOptions estimating = options();
  estimating.estimate = true;
  const auto jobs = plan(estimating);
  const BenchJob& plain = job_of(jobs, "ptrain", "gpt/fp8-single-x1");
  EXPECT_FALSE(has(plain.command, "--fp8")) << plain.command;
  EXPECT_TRUE(job_of(jobs, "pytorch-compiled", "gpt/fp8-single-x1").unavailable.empty());
  const BenchJob& delayed = job_of(jobs, "ptrain", "gpt/fp8-delayed-head-single-x1");
  const auto train_at = delayed.command.find("'train'");
  const auto estimate_at = delayed.command.find("'estimate'");
  ASSERT_NE(train_at, std::string::npos);
  ASSERT_NE(estimate_at, std::string::npos);
  EXPECT_TRUE(has(delayed.command.substr(train_at), "'--fp8-scaling' 'delayed' '--fp8-head'")) << delayed.command;
  EXPECT_TRUE(has(delayed.command.substr(estimate_at, train_at - estimate_at), "'--fp8-head'")) << delayed.command;
  EXPECT_EQ(delayed.metrics_path, "/out/runs/ptrain/gpt/fp8-delayed-head-single-x1.json");
  EXPECT_EQ(job_of(jobs, "pytorch-compiled", "gpt/fp8-delayed-head-single-x1").unavailable,
            "the reference's fp8 is torchao's recipe (each tensor scaled by its own amax, the head in bf16), not this "
            "run's delayed scaling and FP8 head");
  EXPECT_EQ(job_of(jobs, "pytorch", "gpt/fp8-head-single-x1").unavailable,
            "the reference's fp8 is torchao's recipe (each tensor scaled by its own amax, the head in bf16), not this "
            "run's FP8 head");
}

TEST_F(Jobs, TheSuitesCompileModeReachesTheCompiledRunsOnly) {
  std::ofstream(path_) << "pytorch-compile-mode: reduce-overhead\n" << kSuite;
  const auto jobs = plan(options());
  EXPECT_TRUE(has(job_of(jobs, "pytorch-compiled", "resnet/amp-bf16-single-x1").command,
                  "'--compile' '--fused-optimizer' '--compile-mode' 'reduce-overhead'"));
  EXPECT_FALSE(has(job_of(jobs, "pytorch", "resnet/amp-bf16-single-x1").command, "--compile-mode"));
}

TEST_F(Jobs, WhatPytorchCannotDoIsUnavailableWithTheReason) {
  PytorchAbilities old;
  old.known = true;
  old.torch_version = "1.13.0";
  const auto jobs = plan(options(), old);
  EXPECT_EQ(job_of(jobs, "pytorch-compiled", "gpt/fp32-single-x1").unavailable,
            "this PyTorch (torch 1.13.0) has no torch.compile (PyTorch 2.x)");
  EXPECT_TRUE(job_of(jobs, "pytorch", "gpt/fp32-single-x1").unavailable.empty()) << "eager runs all the same";
  EXPECT_EQ(job_of(jobs, "pytorch", "clipped/fp32-single-x1").unavailable,
            "the PyTorch reference has no equivalent of workload key 'clip-grad-norm'");
  PytorchAbilities missing;
  missing.problem = "no such file";
  const auto without_answer = plan(options(), missing);
  EXPECT_NE(job_of(without_answer, "pytorch-compiled", "gpt/fp32-single-x1").unavailable.find("no such file"),
            std::string::npos);
}

// The standard suite's jobs keep their files and flags: records of earlier benches stay where a continued
// bench looks for them. Its workload leaves --channels-last to ptrain's default (auto: channels-last for
// convolutional models on CUDA), and PyTorch eager follows it.
TEST(StandardJobs, KeepTheirPathsAndTheEagerReferenceInPtrainsMemoryFormat) {
  BenchOptions o = options();
  const auto jobs = plan_jobs(load_suite("standard", PTRAIN_SOURCE_DIR, 2), o, "/out", PytorchAbilities{});
  const BenchJob& ptrain = job_of(jobs, "ptrain", "fp32-single-x1");
  EXPECT_EQ(ptrain.metrics_path, "/out/runs/ptrain/fp32-single-x1.json");
  EXPECT_EQ(ptrain.log_path, "/out/logs/ptrain-fp32-single-x1.log");
  EXPECT_TRUE(has(ptrain.command, "'--config' '/out/workload.yaml'")) << ptrain.command;
  const BenchJob& pytorch = job_of(jobs, "pytorch", "amp-bf16-ddp-x2");
  EXPECT_EQ(pytorch.metrics_path, "/out/runs/pytorch/amp-bf16-ddp-x2.json");
  EXPECT_EQ(pytorch.log_path, "/out/logs/pytorch-amp-bf16-ddp-x2.log");
  EXPECT_TRUE(has(pytorch.command, "'--log_dir' '/out/logs/torchrun-amp-bf16-ddp-x2'")) << pytorch.command;
  for (const auto& job : jobs) {
    EXPECT_NE(job.framework, "pytorch-compiled");
    EXPECT_FALSE(has(job.command, "--compile")) << job.command;
    if (job.framework == "pytorch" && job.unavailable.empty()) {
      EXPECT_TRUE(has(job.command, "'--channels-last'")) << "ResNet-50 on CUDA: ptrain's auto is NHWC: " << job.command;
    }
  }
  for (const auto& job : plan_jobs(load_suite("standard", PTRAIN_SOURCE_DIR, 0), o, "/out", PytorchAbilities{})) {
    EXPECT_FALSE(has(job.command, "--channels-last")) << "on the CPU ptrain's auto is NCHW: " << job.command;
  }
}

// The quick suite's GPU workload turns cuDNN's search off in both frameworks: ptrain reads it from the workload
// file, the PyTorch reference gets its flag. The standard suite keeps the search, and so does the quick suite's
// CPU workload, which has no cuDNN.
TEST(QuickJobs, LeaveCudnnsSearchOutInBothFrameworksOnTheGpu) {
  const BenchOptions o = options();
  const Suite quick = load_suite("quick", PTRAIN_SOURCE_DIR, 1);
  EXPECT_EQ(workload_value(quick.workload, "cudnn-benchmark"), "false");
  int pytorch_jobs = 0;
  for (const auto& job : plan_jobs(quick, o, "/out", PytorchAbilities{})) {
    if (job.framework != "pytorch" || !job.unavailable.empty()) continue;
    ++pytorch_jobs;
    EXPECT_TRUE(has(job.command, "'--no-cudnn-benchmark'")) << job.command;
  }
  EXPECT_EQ(pytorch_jobs, 14);
  for (const int gpus : {0, 2}) {
    const std::string suite = gpus == 0 ? "quick" : "standard";
    for (const auto& job : plan_jobs(load_suite(suite, PTRAIN_SOURCE_DIR, gpus), o, "/out", PytorchAbilities{})) {
      EXPECT_FALSE(has(job.command, "cudnn-benchmark")) << suite << ": " << job.command;
    }
  }
}

// The bench asks the reference's Python once what it has; a Python that cannot answer is named.
TEST(ProbePytorch, TellsTheTorchVersionAndWhetherItCompiles) {
  const PytorchAbilities oracle = probe_pytorch(PTRAIN_ORACLE_PYTHON);
  ASSERT_TRUE(oracle.known) << oracle.problem;
  EXPECT_FALSE(oracle.torch_version.empty());
  EXPECT_EQ(oracle.has_compile, oracle.torch_version.front() >= '2') << oracle.torch_version;
  EXPECT_FALSE(oracle.torchvision_version.empty());
  EXPECT_FALSE(oracle.numpy_version.empty());
  const PytorchAbilities missing = probe_pytorch("/nonexistent/python3");
  EXPECT_FALSE(missing.known);
  EXPECT_NE(missing.problem.find("/nonexistent/python3"), std::string::npos) << missing.problem;
}

// Every process of a compound command sees only its GPUs: `ptrain estimate; ptrain train` included.
TEST(CommandOnGpus, ReachesEveryCommandOfTheLine) {
  const std::string command = command_on_gpus("true && echo \"first=$CUDA_VISIBLE_DEVICES\"; echo \"second=$CUDA_VISIBLE_DEVICES\"", {1, 3});
  const std::string output =
      ptrain::testing::run_command("/bin/sh -c '" + command + "'", ptrain::testing::Stderr::Kept).output;
  EXPECT_EQ(output, "first=1,3\nsecond=1,3\n") << command;
  EXPECT_EQ(command_on_gpus("ptrain train", {}), "ptrain train");
}

// --repeat N: each run's ptrain and PyTorch jobs N times in turn, the first round under the usual names (a bench
// without --repeat keeps its records) and each later one under .repeat-K; the memory estimate only once.
TEST_F(Jobs, RepeatRunsEachPairInTurnUnderNamesOfItsRound) {
  BenchOptions o = options();
  o.repeat = 2;
  o.estimate = true;
  const auto jobs = plan(o);
  std::vector<std::string> order;
  for (const auto& job : jobs) {
    if (job.run.id() == "clipped/fp32-single-x1") order.push_back(job.framework + "#" + std::to_string(job.repeat));
  }
  EXPECT_EQ(order, (std::vector<std::string>{"ptrain#1", "pytorch#1", "ptrain#2", "pytorch#2"}));
  EXPECT_EQ(jobs.size(), 22u);
  const auto round = [&](const std::string& framework, int64_t repeat) {
    for (const auto& job : jobs) {
      if (job.framework == framework && job.run.id() == "gpt/fp32-single-x1" && job.repeat == repeat) return job;
    }
    throw std::runtime_error("no round");
  };
  EXPECT_EQ(round("ptrain", 1).metrics_path, "/out/runs/ptrain/gpt/fp32-single-x1.json");
  EXPECT_EQ(round("ptrain", 2).metrics_path, "/out/runs/ptrain/gpt/fp32-single-x1.repeat-2.json");
  EXPECT_TRUE(has(round("ptrain", 2).command, "'--metrics-out' '/out/runs/ptrain/gpt/fp32-single-x1.repeat-2.json'"));
  EXPECT_EQ(round("ptrain", 2).log_path, "/out/logs/gpt/ptrain-fp32-single-x1.repeat-2.log");
  EXPECT_FALSE(round("ptrain", 1).estimate_path.empty());
  EXPECT_TRUE(round("ptrain", 2).estimate_path.empty()) << "one prediction is enough";
  EXPECT_EQ(round("pytorch", 2).metrics_path, "/out/runs/pytorch/gpt/fp32-single-x1.repeat-2.json");
  EXPECT_TRUE(has(round("pytorch", 2).command, "fp32-single-x1.repeat-2.json"));
  o.repeat = 0;
  EXPECT_THROW(plan(o), ptrain::Error);
}

// A real bench on the CPU of dir's suite.yaml into dir/out: this build's ptrain, PyTorch through the oracle's Python.
BenchOptions real_cpu_bench(const TempDir& dir) {
  BenchOptions o;
  o.suite = dir.file("suite.yaml");
  o.source_dir = PTRAIN_SOURCE_DIR;
  o.out_dir = dir.file("out");
  o.gpus = 0;
  o.estimate = false;
  o.pytorch = true;
  o.python = PTRAIN_ORACLE_PYTHON;
  o.ptrain_executable = PTRAIN_EXECUTABLE;
  return o;
}

// A whole bench of a tiny CPU suite with --repeat 2: four processes, in turn, each record with its round, the
// load averages around it and its steady step times; the report gives the ratio as a median with its range.
TEST(BenchRepeat, TwoRoundsOfATinySuiteGiveInterleavedRecordsAndAReportWithMedianAndRange) {
  TempDir dir;
  std::ofstream(dir.file("suite.yaml")) << "name: tiny\nworkload: {model: resnet20, dataset: synthetic, data-path: "
                                           "\"64:1x8x8:4\", batch-size: 8, epochs: 1, test-limit: 8, threads: 1}\n"
                                           "runs:\n  - {precision: fp32}\n";
  BenchOptions o = real_cpu_bench(dir);
  o.repeat = 2;
  std::ostringstream progress;
  const BenchOutcome outcome = run_bench(o, progress);
  ASSERT_EQ(outcome.completed, 4) << progress.str();
  const std::string text = progress.str();
  std::vector<size_t> at;
  for (const char* line : {"[1/4] ptrain ", "[2/4] pytorch ", "[3/4] ptrain ", "[4/4] pytorch "}) {
    at.push_back(text.find(line));
    ASSERT_NE(at.back(), std::string::npos) << line << "\n" << text;
  }
  EXPECT_TRUE(std::is_sorted(at.begin(), at.end())) << text;
  for (const std::string framework : {"ptrain", "pytorch"}) {
    for (int64_t round : {1, 2}) {
      const std::string path = o.out_dir + "/runs/" + framework + "/fp32-single-x1" +
                               (round == 1 ? std::string() : ".repeat-2") + ".json";
      std::ifstream in(path);
      ASSERT_TRUE(in.good()) << path;
      const auto record = metrics::run_record_from_json(nlohmann::json::parse(in));
      EXPECT_EQ(record.extra.at("bench").at("repeat"), round) << path;
      EXPECT_EQ(record.extra.at("bench").at("load_average_before").size(), 3u) << path;
      EXPECT_EQ(record.extra.at("bench").at("load_average_after").size(), 3u) << path;
      // 8 steps, steady after step 2: six steps, each timed on the CPU.
      EXPECT_EQ(record.steady_step_seconds.size(), 6u) << path;
      EXPECT_EQ(record.steady_step_timing, "step") << path;
      ASSERT_TRUE(record.steady_step_median_seconds.has_value()) << path;
      EXPECT_LE(*record.steady_step_p10_seconds, *record.steady_step_median_seconds);
      EXPECT_LE(*record.steady_step_median_seconds, *record.steady_step_p90_seconds);
    }
  }
  const std::string& md = outcome.report.markdown;
  EXPECT_TRUE(std::regex_search(md, std::regex(R"(\| [0-9.]+x \([0-9.]+-[0-9.]+x, 2 pairs\)( noisy)? \|)"))) << md;
  EXPECT_NE(md.find("Machine load during the bench: load average (1 min) "), std::string::npos) << md;
  EXPECT_NE(md.find("around the 4 runs"), std::string::npos) << md;
}

// A suite's estimate: false leaves `ptrain estimate` out of its ptrain jobs as --no-estimate does.
TEST(SuiteEstimateKey, FalseLeavesTheEstimateOutOfPtrainsCommand) {
  TempDir dir;
  const auto jobs_of = [&](const std::string& extra) {
    std::ofstream(dir.file("suite.yaml")) << "name: s\nworkload: {model: resnet20}\nruns:\n  - {precision: fp32}\n"
                                          << extra;
    BenchOptions o = options();
    o.estimate = true;
    return plan_jobs(load_suite(dir.file("suite.yaml"), "/none", 0), o, "/out", torch2());
  };
  EXPECT_TRUE(has(jobs_of("").front().command, " 'estimate' "));
  EXPECT_FALSE(jobs_of("").front().estimate_path.empty());
  EXPECT_FALSE(has(jobs_of("estimate: false\n").front().command, " 'estimate' "));
  EXPECT_TRUE(jobs_of("estimate: false\n").front().estimate_path.empty());
}

// The expected duration's arithmetic: each job's start (more for PyTorch, torch.compile, the estimate, a launch),
// its steps at its step time, the JIT once per dtype and each warm-up's start.
TEST(ExpectedDuration, AddsStartsStepsJitAndWarmUps) {
  JobDuration ptrain;
  ptrain.steps = 60;
  ptrain.step_seconds = 0.1;
  JobDuration eager = ptrain;
  eager.pytorch = true;
  eager.multi_process = true;
  eager.step_seconds = 0.2;
  eager.measured = true;
  JobDuration compiled;
  compiled.pytorch = compiled.compiled = true;
  compiled.steps = 10;  // no step time: unknown
  JobDuration estimated;
  estimated.estimate = true;
  JobDuration plain_pytorch;
  plain_pytorch.pytorch = true;
  const DurationEstimate e =
      expected_duration({ptrain, eager, compiled, estimated}, 2, {JobDuration{}, eager, JobDuration{}, plain_pytorch});
  EXPECT_EQ(e.jobs, 4);
  EXPECT_EQ(e.steps, 130);
  EXPECT_DOUBLE_EQ(e.step_seconds, 60 * 0.1 + 60 * 0.2);
  EXPECT_DOUBLE_EQ(e.start_seconds, kPtrainStartSeconds + (kPytorchStartSeconds + kLaunchSeconds) +
                                        (kPytorchStartSeconds + kCompileSeconds) +
                                        (kPtrainStartSeconds + kEstimateSeconds));
  EXPECT_DOUBLE_EQ(e.jit_seconds, 2 * kJitSecondsPerDtype);
  // Side by side, a framework's at a time: the slowest start of each.
  EXPECT_DOUBLE_EQ(e.warm_up_seconds, kPtrainStartSeconds + kPytorchStartSeconds + kLaunchSeconds);
  EXPECT_DOUBLE_EQ(e.seconds, e.start_seconds + e.step_seconds + e.jit_seconds + e.warm_up_seconds);
  EXPECT_EQ(e.measured, 1);
  EXPECT_EQ(e.from_flops, 1);
  EXPECT_EQ(e.unknown, 2);  // the compiled job and the estimated one
  EXPECT_EQ(expected_duration({}, 0, {}).seconds, 0.0);
}

// A GPU run in fp32 of a convolutional model searches cuDNN's algorithms in its first steps, in every process, the
// warm-up's included: its start counts that search.
TEST(ExpectedDuration, AnFp32ConvolutionRunPaysCudnnsSearchInItsStart) {
  JobDuration searching;
  searching.fp32_convolution_search = true;
  JobDuration plain;
  const DurationEstimate e = expected_duration({searching, plain}, 0, {searching, plain});
  EXPECT_DOUBLE_EQ(e.start_seconds, 2 * kPtrainStartSeconds + kFp32ConvolutionSearchSeconds);
  EXPECT_DOUBLE_EQ(e.warm_up_seconds, kPtrainStartSeconds + kFp32ConvolutionSearchSeconds);
  EXPECT_NE(duration_line(e, "x").find("cuDNN's search in a GPU fp32 run of convolutions +28 s"), std::string::npos)
      << duration_line(e, "x");
}

TEST(ExpectedDuration, OneLineSaysRunsMinutesAndWhatItRestsOn) {
  JobDuration job;
  job.steps = 100;
  job.step_seconds = 0.5;
  const DurationEstimate e = expected_duration({job, job}, 1, {});
  const std::string line = duration_line(e, "from model FLOPs at an assumed 20 GFLOP/s of the CPU");
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  // 2 x 6 s of starts, 16 s of JIT, 2 x 100 x 0.5 s of steps: 128 s.
  EXPECT_EQ(line.rfind("expected: 2 runs, about 2.1 minutes (128 s): 12 s of process starts", 0), 0u) << line;
  EXPECT_TRUE(has(line, "16 s of kernel JIT")) << line;
  EXPECT_TRUE(has(line, "100 s of 200 steps (a step's time: 2 from model FLOPs at an assumed 20 GFLOP/s of the CPU)"))
      << line;
  EXPECT_TRUE(has(line, "evaluation and data loading not counted")) << line;
  JobDuration measured = job;
  measured.measured = true;
  EXPECT_TRUE(has(duration_line(expected_duration({measured}, 0, {}), "x"), "1 from earlier records in --out"));
  EXPECT_TRUE(has(duration_line(expected_duration({JobDuration{}}, 0, {}), "x"), "1 unknown, not counted"));
  // Past ten minutes, whole minutes.
  JobDuration long_job = job;
  long_job.steps = 2000;
  EXPECT_EQ(duration_line(expected_duration({long_job}, 0, {}), "x").rfind("expected: 1 run, about 17 minutes", 0), 0u);
}

TEST(ExpectedDuration, StepTimeFromModelFlops) {
  config::TrainConfig c;
  c.model.name = "resnet50";
  c.data.dataset = "cifar10";
  c.data.image_size = 224;
  const auto resnet50 = forward_flops_per_sample(c);
  ASSERT_TRUE(resnet50.has_value());
  EXPECT_NEAR(*resnet50 / 1e9, 8.18, 0.05);  // torchvision's 4.09 GMACs at 224 px (10 classes: a smaller fc)
  // Batch 128 on an H100's 67 TFLOP/s fp32 at 35%: 3 x 8.18 GFLOP x 128 / 23.4 TFLOP/s = 0.134 s.
  EXPECT_NEAR(step_seconds_from_flops(*resnet50, 128, 67e12, assumed_mfu(metrics::MathRate::kFp32)), 0.134, 0.002);
  c.model.name = "gpt-small";
  c.data.dataset = "synthetic-tokens";
  c.data.path = "480:1024:50257";
  const auto gpt = forward_flops_per_sample(c);
  ASSERT_TRUE(gpt.has_value());
  EXPECT_NEAR(*gpt / (2.0 * 1024), 163e6, 2e6);  // 2 FLOPs a parameter and token: GPT-2 small's 163 M, head untied
  c.model.name = "/no/such/model.pt";
  EXPECT_FALSE(forward_flops_per_sample(c).has_value());
}

// A suite with warm-up: true and accuracy: false: the bench says what it expects before it starts, trains one
// untimed run per dtype and framework before the first timed one, and its report says that accuracy is left
// out and what the warm-up took.
TEST(BenchQuickForm, ExpectsWarmsUpAndLeavesAccuracyOutInTheReport) {
  TempDir dir;
  std::ofstream(dir.file("suite.yaml")) << "name: tiny\nwarm-up: true\naccuracy: false\n"
                                           "workload: {model: resnet20, dataset: synthetic, data-path: "
                                           "\"64:1x8x8:4\", batch-size: 8, epochs: 1, test-limit: 8, threads: 1}\n"
                                           "runs:\n  - {precision: fp32}\n  - {precision: bf16}\n";
  const BenchOptions o = real_cpu_bench(dir);
  std::ostringstream progress;
  const BenchOutcome outcome = run_bench(o, progress);
  const std::string text = progress.str();
  ASSERT_EQ(outcome.completed, 4) << text;
  const size_t expected = text.find("ptrain bench: expected: 4 runs, about ");
  ASSERT_NE(expected, std::string::npos) << text;
  EXPECT_TRUE(has(text, "32 steps")) << text;  // 8 steps a run (64 samples of 8)
  for (const char* warm : {"warm-up: ptrain fp32 ", "warm-up: ptrain bf16 ", "warm-up: pytorch fp32 ",
                           "warm-up: pytorch bf16 "}) {
    const size_t at = text.find(warm);
    ASSERT_NE(at, std::string::npos) << warm << "\n" << text;
    EXPECT_GT(at, expected);
    EXPECT_LT(at, text.find("[1/4] ptrain ")) << "the warm-up comes before the first timed run\n" << text;
  }
  EXPECT_FALSE(has(text, "FAILED")) << text;
  // The warm-up's files stay apart from the records the report reads.
  EXPECT_TRUE(std::ifstream(o.out_dir + "/warm-up/runs/ptrain/fp32-single-x1.json").good());
  const std::string& md = outcome.report.markdown;
  EXPECT_TRUE(has(md, "Accuracy is left out: suite tiny trains short runs")) << md;
  EXPECT_TRUE(has(md, "ptrain bench --suite standard")) << md;
  EXPECT_TRUE(has(md, "Warm-up: before the clocks started, the bench trained 5 untimed steps per dtype (fp32, bf16) in "
                      "ptrain and in PyTorch eager, "))
      << md;
  std::ifstream html(outcome.report.html_path);
  std::stringstream page;
  page << html.rdbuf();
  EXPECT_TRUE(has(page.str(), "Accuracy is left out")) << outcome.report.html_path;
  EXPECT_FALSE(has(md, "warm-up/")) << "no warm-up record in the report\n" << md;
}

}  // namespace
}  // namespace ptrain::bench
