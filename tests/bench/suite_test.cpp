// Suites: what a user's YAML says is what runs, and what it gets wrong is named by file and key.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include "ptrain/bench/jobs.h"
#include "ptrain/bench/suite.h"
#include "ptrain/core/error.h"
#include "ptrain/models/model.h"
#include "test_support.h"

namespace ptrain::bench {
namespace {

using ptrain::testing::TempDir;

std::string write(const TempDir& dir, const std::string& text) {
  const std::string path = dir.file("suite.yaml");
  std::ofstream(path) << text;
  return path;
}

const char* kSuite = R"(name: mine
workload: {model: resnet20, dataset: synthetic, data-path: "64:3x8x8:4", batch-size: 8, milestones: [1, 2]}
runs:
  - {precision: fp32}
  - {precision: bf16, master-weights: true}
  - {precision: amp-bf16, strategy: ddp, devices: all}
  - {precision: fp32, strategy: dp, devices: 2}
cpu-runs:
  - {precision: fp32}
  - {precision: fp32, strategy: ddp, devices: all}
)";

TEST(Suite, StandardSuiteLoadsForGpusAndForTheCpu) {
  const Suite gpu = load_suite("standard", PTRAIN_SOURCE_DIR, 4);
  EXPECT_EQ(gpu.name, "standard");
  EXPECT_TRUE(gpu.on_gpu);
  ASSERT_FALSE(gpu.runs.empty());
  EXPECT_EQ(gpu.runs.front().id(), "fp32-single-x1");
  EXPECT_EQ(gpu.runs.back().devices, 4);
  const Suite cpu = load_suite("standard", PTRAIN_SOURCE_DIR, 0);
  EXPECT_FALSE(cpu.on_gpu);
  for (const char* stage : {"zero1", "zero2", "zero3", "fsdp"}) {
    EXPECT_TRUE(std::any_of(gpu.runs.begin(), gpu.runs.end(), [&](const SuiteRun& r) { return r.strategy == stage; }))
        << stage << " missing from the GPU runs";
    EXPECT_TRUE(std::any_of(cpu.runs.begin(), cpu.runs.end(), [&](const SuiteRun& r) { return r.strategy == stage; }))
        << stage << " missing from the CPU runs";
  }
  bool fashion = false;
  for (const auto& [key, value] : cpu.workload) fashion = fashion || (key == "dataset" && value == "fashion-mnist");
  EXPECT_TRUE(fashion) << "the CPU variant trains on the embedded Fashion-MNIST";
}

// The quick suite is the standard one's every run (GPU and CPU alike), shortened, with the warm-up, without the
// estimates, and with accuracy said to be left out; a plain suite has none of that.
TEST(Suite, QuickSuiteHasEveryStandardRunWarmsUpAndLeavesAccuracyOut) {
  for (const int64_t gpus : {1, 0}) {
    const Suite standard = load_suite("standard", PTRAIN_SOURCE_DIR, gpus);
    const Suite quick = load_suite("quick", PTRAIN_SOURCE_DIR, gpus);
    EXPECT_EQ(quick.name, "quick");
    ASSERT_EQ(quick.runs.size(), standard.runs.size()) << gpus << " GPUs";
    for (size_t i = 0; i < quick.runs.size(); ++i) {
      EXPECT_EQ(quick.runs[i].id(), standard.runs[i].id());
      EXPECT_EQ(quick.runs[i].pytorch, standard.runs[i].pytorch) << quick.runs[i].id();
    }
    EXPECT_TRUE(quick.warm_up);
    EXPECT_FALSE(quick.estimate);
    EXPECT_FALSE(quick.accuracy);
    EXPECT_FALSE(standard.warm_up);
    EXPECT_TRUE(standard.estimate);
    EXPECT_TRUE(standard.accuracy);
    // The same model and data as the standard suite's, cut short.
    for (const char* key : {"model", "dataset", "batch-size"}) {
      EXPECT_EQ(workload_value(quick.workload, key), workload_value(standard.workload, key)) << key;
    }
    EXPECT_FALSE(workload_value(quick.workload, "max-steps").empty());
    EXPECT_FALSE(workload_value(quick.workload, "train-limit").empty());
  }
  const Suite gpu = load_suite("quick", PTRAIN_SOURCE_DIR, 1);
  EXPECT_EQ(workload_value(gpu.workload, "max-steps"), "60");
  EXPECT_EQ(workload_value(gpu.workload, "train-limit"), "7680");  // 60 steps of 128 on one GPU
}

TEST(Suite, WarmUpEstimateAndAccuracyKeysAreTrueOrFalseNamedByFile) {
  TempDir dir;
  const std::string base = "name: s\nworkload: {model: resnet20}\nruns:\n  - {precision: fp32}\n";
  const Suite keys = load_suite(write(dir, base + "warm-up: yes\nestimate: off\naccuracy: false\n"), "/none", 0);
  EXPECT_TRUE(keys.warm_up);
  EXPECT_FALSE(keys.estimate);
  EXPECT_FALSE(keys.accuracy);
  for (const char* bad : {"warm-up: maybe\n", "estimate: [true]\n", "accuracy: 2\n"}) {
    const std::string path = write(dir, base + bad);
    try {
      load_suite(path, "/none", 0);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const ptrain::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path), std::string::npos) << what;
      const std::string key = std::string(bad).substr(0, std::string(bad).find(':'));
      EXPECT_NE(what.find(key), std::string::npos) << what;
    }
  }
}

TEST(Suite, RunsResolveDevicesAndCpuVariantsReplaceTheRuns) {
  TempDir dir;
  const std::string path = write(dir, kSuite);
  const Suite gpu = load_suite(path, "/nonexistent", 3);
  ASSERT_EQ(gpu.runs.size(), 4u);
  EXPECT_EQ(gpu.runs[1].id(), "bf16-master-single-x1");
  EXPECT_EQ(gpu.runs[2].devices, 3);
  EXPECT_EQ(gpu.runs[3].devices, 2);
  EXPECT_EQ(gpu.workload.back(), (std::pair<std::string, std::string>{"milestones", "1,2"}));
  const Suite cpu = load_suite(path, "/nonexistent", 0);
  ASSERT_EQ(cpu.runs.size(), 2u);
  EXPECT_EQ(cpu.runs[1].devices, 2) << "all means two CPU processes";
  EXPECT_EQ(cpu.workload, gpu.workload) << "without cpu-workload the workload stays";
}

void expect_refused(const std::string& yaml, const std::vector<std::string>& words, int64_t gpus = 2) {
  TempDir dir;
  const std::string path = write(dir, yaml);
  try {
    load_suite(path, "/nonexistent", gpus);
    ADD_FAILURE() << "accepted:\n" << yaml;
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    for (const auto& w : words) EXPECT_NE(message.find(w), std::string::npos) << "'" << w << "' missing in: " << message;
  }
}

TEST(Suite, BadSuitesAreNamedByFileAndKey) {
  expect_refused("workload: {model: resnet20}\nrunz: []\n", {"'runz'"});
  expect_refused("runs: [{precision: fp32}]\n", {"'workload'"});
  expect_refused("workload: {model: resnet20, precision: fp16}\nruns: [{precision: fp32}]\n", {"'precision'", "per run"});
  expect_refused("workload: {model: resnet20}\nruns: [{precision: fp32, strategy: fsdp9}]\n", {"runs[0]", "fsdp9"});
  expect_refused("workload: {model: resnet20}\nruns: [{precision: fp32, devices: 3}]\n", {"runs[0]", "only 2 GPU"});
  expect_refused("workload: {model: resnet20}\nruns: [{precision: fp32, strategy: dp, devices: many}]\n", {"many"});
  expect_refused("workload: {model: resnet20}\nruns: [{precision: fp32}, {precision: fp32}]\n", {"runs[1]", "same run"});
  expect_refused("workload: {model: resnet20}\nruns: [{precision: fp32, colour: red}]\n", {"'colour'"});
  expect_refused("workload: {model: resnet20}\nruns: [{precision: fp32, devices: 2}]\n", {"single runs on one device"});
  expect_refused("pytorch-compile-mode: fastest\nworkload: {model: resnet20}\nruns: [{precision: fp32}]\n",
                 {"pytorch-compile-mode 'fastest'", "reduce-overhead"});
}

// skip-fusions on a run: ptrain's alone, each a fusion of models::fusion_names() once; the run's id and label say
// which, and its ptrain job passes them to `ptrain train`.
TEST(Suite, RunsSkipFusionsByNameAndAlone) {
  const std::string head = "workload: {model: resnet20}\nruns:\n";
  expect_refused(head + "  - {precision: amp-bf16, skip-fusions: stem_pool, pytorch: none}\n",
                 {"runs[0]", "'stem_pool' is not a fusion (did you mean stem-pool?)", "residual-twins"});
  expect_refused(head + "  - {precision: amp-bf16, skip-fusions: [stem-pool, stem-pool], pytorch: none}\n",
                 {"runs[0]", "named twice"});
  expect_refused(head + "  - {precision: amp-bf16, skip-fusions: weight-casts}\n", {"runs[0]", "ptrain's alone"});
  // A comma text is a list, and one set of fusions is one run however it is written.
  expect_refused(head + "  - {precision: amp-bf16, skip-fusions: \"residual-twins,stem-pool\", pytorch: none}\n"
                        "  - {precision: amp-bf16, skip-fusions: [stem-pool, residual-twins], pytorch: none}\n",
                 {"runs[1]", "same run"});
  TempDir dir;
  const std::string runs = "  - {precision: amp-bf16}\n"
                           "  - {precision: amp-bf16, skip-fusions: weight-casts, pytorch: none}\n"
                           "  - {precision: amp-bf16, skip-fusions: [stem-pool, shortcut-norms], pytorch: none}\n";
  const Suite suite = load_suite(write(dir, head + runs), "/nonexistent", 1);
  ASSERT_EQ(suite.runs.size(), 3u);
  EXPECT_EQ(suite.runs[1].id(), "amp-bf16-single-x1-no-weight-casts");
  EXPECT_EQ(suite.runs[2].id(), "amp-bf16-single-x1-no-shortcut-norms-no-stem-pool") << "in fusion_names' order";
  EXPECT_EQ(suite.runs[2].label(), "amp-bf16, single, 1 device, without shortcut-norms, stem-pool");
  const auto arguments = ptrain_train_arguments(suite, suite.runs[2], dir.file("out"), dir.file("run.json"));
  const auto flag = std::find(arguments.begin(), arguments.end(), "--skip-fusions");
  ASSERT_NE(flag, arguments.end());
  ASSERT_NE(flag + 1, arguments.end());
  EXPECT_EQ(*(flag + 1), "shortcut-norms,stem-pool");
  const auto plain = ptrain_train_arguments(suite, suite.runs[0], dir.file("out"), dir.file("run.json"));
  EXPECT_EQ(std::find(plain.begin(), plain.end(), "--skip-fusions"), plain.end());
}

// The fusions suite: ResNet-50 with every fusion and without each of its four in turn, GPT-2 small with every
// fusion and without each of its three in amp-bf16, and in FP8 with and without fp8-amax (the speed suite's
// workloads), PyTorch compiled beside the amp-bf16 full sets only; on the CPU the weight casts alone.
TEST(Suite, FusionsSuiteLeavesOutEachFusionOnceBesideTheFullSet) {
  const Suite gpu = load_suite("fusions", PTRAIN_SOURCE_DIR, 1);
  const Suite speed = load_suite("speed", PTRAIN_SOURCE_DIR, 1);
  std::set<std::string> jobs;
  for (const auto& run : gpu.runs) {
    EXPECT_TRUE(run.precision == "amp-bf16" || run.precision == "fp8") << run.id();
    EXPECT_EQ(gpu.workload_of(run), speed.workload_of(run)) << run.id();
    if (run.ptrain) jobs.insert("ptrain/" + run.id());
    for (const auto& variant : run.pytorch) jobs.insert(variant + "/" + run.id());
  }
  std::set<std::string> expected = {"ptrain/resnet50/amp-bf16-single-x1", "compiled/resnet50/amp-bf16-single-x1",
                                    "ptrain/gpt2-small/amp-bf16-single-x1", "compiled/gpt2-small/amp-bf16-single-x1",
                                    "ptrain/gpt2-small/amp-bf16-single-x1-no-weight-casts",
                                    "ptrain/gpt2-small/amp-bf16-single-x1-no-bias-gradients",
                                    "ptrain/gpt2-small/amp-bf16-single-x1-no-residual-adds",
                                    "ptrain/gpt2-small/fp8-single-x1", "ptrain/gpt2-small/fp8-single-x1-no-fp8-amax"};
  for (const auto& fusion : models::fusion_names())
    if (fusion != "bias-gradients" && fusion != "residual-adds" && fusion != "fp8-amax")
      expected.insert("ptrain/resnet50/amp-bf16-single-x1-no-" + fusion);
  EXPECT_EQ(jobs, expected);
  const Suite cpu = load_suite("fusions", PTRAIN_SOURCE_DIR, 0);
  for (const auto& run : cpu.runs) {
    EXPECT_TRUE(run.pytorch.empty()) << run.id();
    EXPECT_TRUE(run.skip_fusions.empty() || run.skip_fusions == std::vector<std::string>{"weight-casts"}) << run.id();
  }
  EXPECT_EQ(cpu.runs.size(), 4u);
}

TEST(Suite, PytorchCompileModeIsDefaultUnlessTheSuiteNamesOne) {
  TempDir dir;
  EXPECT_EQ(load_suite(write(dir, kSuite), "/nonexistent", 2).pytorch_compile_mode, "default");
  const std::string named = std::string("pytorch-compile-mode: reduce-overhead\n") + kSuite;
  EXPECT_EQ(load_suite(write(dir, named), "/nonexistent", 2).pytorch_compile_mode, "reduce-overhead");
}

// compiled runs the suite's pytorch-compile-mode; compiled-MODE another mode, as a variant of its own.
TEST(Suite, CompiledVariantsNameTheirCompileMode) {
  TempDir dir;
  const std::string suite = "pytorch-compile-mode: reduce-overhead\nworkload: {model: resnet20}\nruns:\n"
                            "  - {precision: amp-bf16, pytorch: [eager, compiled, compiled-default]}\n"
                            "  - {precision: fp32, pytorch: compiled-max-autotune}\n"
                            "  - {precision: bf16, pytorch: [compiled-reduce-overhead]}\n";
  const Suite loaded = load_suite(write(dir, suite), "/nonexistent", 1);
  ASSERT_EQ(loaded.runs.size(), 3u);
  EXPECT_EQ(loaded.runs[0].pytorch, (std::vector<std::string>{"eager", "compiled", "compiled-default"}));
  EXPECT_EQ(loaded.runs[1].pytorch, std::vector<std::string>{"compiled-max-autotune"});
  EXPECT_EQ(loaded.runs[2].pytorch, std::vector<std::string>{"compiled"}) << "the suite's own mode is compiled";
  EXPECT_EQ(loaded.compile_mode_of("compiled"), "reduce-overhead");
  EXPECT_EQ(loaded.compile_mode_of("compiled-default"), "default");
  EXPECT_EQ(loaded.compile_mode_of("compiled-max-autotune"), "max-autotune");
  EXPECT_EQ(loaded.compile_mode_of("eager"), "");
  EXPECT_TRUE(is_compiled_variant("compiled-default"));
  EXPECT_TRUE(is_compiled_variant("compiled"));
  EXPECT_FALSE(is_compiled_variant("eager"));
}

TEST(Suite, BadCompiledVariantsAreNamedByFileAndRun) {
  const std::string head = "pytorch-compile-mode: reduce-overhead\nworkload: {model: resnet20}\n";
  expect_refused(head + "runs: [{precision: fp32, pytorch: [eager, compiled-fastest]}]\n",
                 {"runs[0]", "'compiled-fastest'", "'fastest' is not a torch.compile mode", "reduce-overhead"});
  expect_refused(head + "runs: [{precision: fp32}, {precision: fp16, pytorch: [compiled, compiled-reduce-overhead]}]\n",
                 {"runs[1]", "'compiled' twice", "pytorch-compile-mode, reduce-overhead"});
  expect_refused(head + "runs: [{precision: fp32, pytorch: compiled-default}, "
                        "{precision: fp32, ptrain: false, pytorch: compiled-default}]\n",
                 {"runs[1]", "same run", "pytorch compiled-default job"});
  expect_refused(head + "runs: [{precision: fp32, pytorch: compiledish}]\n", {"runs[0]", "'compiledish'", "compiled-MODE"});
  expect_refused("workloads: {pytorch-compiled-default: {model: resnet20}}\n"
                 "runs: [{workload: pytorch-compiled-default, precision: fp32}]\n",
                 {"reads as a framework"});
}

// A run's own batch-size: in its id and label, its workload's train-limit scaled with it so that the run
// keeps its steps; the other runs keep the workload's batch.
TEST(Suite, ARunsBatchSizeNamesItAndScalesTheTrainLimit) {
  TempDir dir;
  const std::string suite =
      "workload: {model: resnet50, dataset: cifar10, batch-size: 128, max-steps: 30, train-limit: 3840}\nruns:\n"
      "  - {precision: amp-bf16}\n"
      "  - {precision: amp-bf16, batch-size: 256}\n"
      "  - {precision: amp-bf16, batch-size: 400, pytorch: [eager, compiled]}\n"
      "  - {precision: amp-bf16, batch-size: 100}\n";
  const Suite loaded = load_suite(write(dir, suite), "/nonexistent", 1);
  ASSERT_EQ(loaded.runs.size(), 4u);
  EXPECT_EQ(loaded.runs[0].id(), "amp-bf16-single-x1");
  EXPECT_EQ(loaded.runs[1].id(), "amp-bf16-single-x1-b256");
  EXPECT_EQ(loaded.runs[2].id(), "amp-bf16-single-x1-b400");
  EXPECT_EQ(loaded.runs[2].label(), "amp-bf16, single, 1 device, batch 400");
  const auto value = [](const WorkloadKeys& keys, const std::string& key) {
    for (const auto& [k, v] : keys) {
      if (k == key) return v;
    }
    return std::string("(none)");
  };
  EXPECT_EQ(value(loaded.run_workload(loaded.runs[0]), "batch-size"), "128");
  EXPECT_EQ(value(loaded.run_workload(loaded.runs[0]), "train-limit"), "3840");
  EXPECT_EQ(value(loaded.run_workload(loaded.runs[1]), "batch-size"), "256");
  EXPECT_EQ(value(loaded.run_workload(loaded.runs[1]), "train-limit"), "7680");
  EXPECT_EQ(value(loaded.run_workload(loaded.runs[2]), "train-limit"), "12000");
  EXPECT_EQ(value(loaded.run_workload(loaded.runs[3]), "train-limit"), "3000");
  EXPECT_EQ(value(loaded.workload_of(loaded.runs[2]), "batch-size"), "128") << "the workload itself stays";

  // Rounded up, never a step fewer; a workload without a train-limit (or 0: every sample) keeps it; a
  // workload without a batch-size gains one.
  const Suite odd = load_suite(write(dir, "workload: {model: resnet20, batch-size: 96, train-limit: 1000}\n"
                                          "runs: [{precision: fp32, batch-size: 100}]\n"),
                               "/nonexistent", 1);
  EXPECT_EQ(value(odd.run_workload(odd.runs[0]), "train-limit"), "1042");
  const Suite open = load_suite(write(dir, "workload: {model: resnet20, train-limit: 0}\n"
                                           "runs: [{precision: fp32, batch-size: 64}]\n"),
                                "/nonexistent", 1);
  EXPECT_EQ(value(open.run_workload(open.runs[0]), "train-limit"), "0");
  EXPECT_EQ(value(open.run_workload(open.runs[0]), "batch-size"), "64");
}

TEST(Suite, BadBatchSizesAreNamedByFileAndRun) {
  const std::string head = "workload: {model: resnet20, batch-size: 128, train-limit: 3840}\n";
  for (const char* bad : {"lots", "0", "-8", "2.5", "[1, 2]"}) {
    SCOPED_TRACE(bad);
    const bool list = std::string(bad).front() == '[';
    expect_refused(head + "runs: [{precision: fp32}, {precision: fp32, batch-size: " + bad + "}]\n",
                   list ? std::vector<std::string>{"runs[1]", "'batch-size'", "a single value"}
                        : std::vector<std::string>{"runs[1]", "'batch-size'", std::string("'") + bad + "'",
                                                   "not a positive whole number"});
  }
  expect_refused(head + "runs: [{precision: fp32, batch-size: 128}]\n",
                 {"fp32-single-x1-b128", "batch-size 128 is its workload's own"});
  expect_refused(head + "runs: [{precision: fp32, batch-size: 256}, {precision: fp32, batch-size: 256}]\n",
                 {"runs[1]", "same run"});
  expect_refused("workload: {model: resnet20, global-batch-size: 512}\nruns: [{precision: fp32, batch-size: 256}]\n",
                 {"run fp32-single-x1-b256", "global-batch-size"});
  expect_refused(head + "runs: [{precision: fp32, batch-sise: 256}]\n", {"runs[0]", "'batch-sise'", "is not a run key"});
}

// fp8's own flags are the run's: its id and label carry them, and a run of another precision refuses them.
TEST(Suite, Fp8FlagsOnARunNameItAndBelongToFp8Only) {
  TempDir dir;
  const Suite loaded = load_suite(write(dir, "workload: {model: gpt-tiny}\nruns:\n"
                                             "  - {precision: fp8}\n"
                                             "  - {precision: fp8, fp8-scaling: delayed, fp8-head: true, pytorch: none}\n"
                                             "  - {precision: fp8, fp8_head: yes}\n"
                                             "  - {precision: fp8, fp8-scaling: delayed}\n"),
                                  "/nonexistent", 1);
  ASSERT_EQ(loaded.runs.size(), 4u);
  EXPECT_EQ(loaded.runs[0].id(), "fp8-single-x1");
  EXPECT_FALSE(loaded.runs[0].fp8_beyond_defaults());
  EXPECT_EQ(loaded.runs[1].id(), "fp8-delayed-head-single-x1");
  EXPECT_EQ(loaded.runs[1].label(), "fp8 (delayed scaling) + FP8 head, single, 1 device");
  EXPECT_TRUE(loaded.runs[1].pytorch.empty());
  EXPECT_TRUE(loaded.runs[1].fp8_beyond_defaults());
  EXPECT_EQ(loaded.runs[2].id(), "fp8-head-single-x1");
  EXPECT_EQ(loaded.runs[3].id(), "fp8-delayed-single-x1");
  const std::string head = "workload: {model: gpt-tiny}\n";
  expect_refused(head + "runs: [{precision: amp-bf16, fp8-scaling: delayed}]\n",
                 {"runs[0]", "fp8-scaling and fp8-head belong to precision fp8, not amp-bf16"});
  expect_refused(head + "runs: [{precision: bf16, fp8-head: true}]\n", {"runs[0]", "not bf16"});
  expect_refused(head + "runs: [{precision: amp-bf16, fp8-scaling: dynamic}]\n",
                 {"runs[0]", "belong to precision fp8, not amp-bf16"});
  expect_refused(head + "runs: [{precision: fp8, fp8-scaling: lazy}]\n",
                 {"runs[0]", "'fp8-scaling'", "'lazy' is neither dynamic nor delayed"});
  expect_refused(head + "runs: [{precision: fp8, fp8-head: maybe}]\n", {"runs[0]", "'fp8-head'", "'maybe'"});
  expect_refused(head + "runs: [{precision: fp8, fp8-scaling: delayed}, {precision: fp8, fp8-scaling: delayed}]\n",
                 {"runs[1]", "same run"});
}

TEST(Suite, UnknownSuiteNamesTheFileItLookedFor) {
  try {
    load_suite("nosuch", "/src", 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/src/configs/bench/nosuch.yaml"), std::string::npos) << e.what();
  }
}


const char* kSeveral = R"(name: several
workloads:
  images: {model: resnet20, dataset: synthetic, data-path: "64:3x8x8:4", batch-size: 8, max-steps: 4}
  tokens: {model: gpt-tiny, dataset: synthetic-tokens, data-path: "32:16:20", batch-size: 4, optimizer: adamw}
runs:
  - {workload: images, precision: amp-bf16, pytorch: [eager, compiled]}
  - {workload: tokens, precision: fp32, pytorch: none}
  - {workload: tokens, precision: fp32, ptrain: false, pytorch: compiled}
  - {workload: tokens, precision: bf16, pytorch: eager}
cpu-workloads:
  small: {model: resnet20, dataset: synthetic, data-path: "32:3x8x8:4", batch-size: 4}
cpu-runs:
  - {workload: small, precision: fp32, pytorch: [compiled, eager]}
)";

TEST(Suite, SeveralWorkloadsNameTheirRunsAndTheSameRunMayAskForOtherJobsLater) {
  TempDir dir;
  const std::string path = write(dir, kSeveral);
  const Suite gpu = load_suite(path, "/nonexistent", 1);
  ASSERT_TRUE(gpu.has_several_workloads());
  EXPECT_TRUE(gpu.workload.empty());
  ASSERT_EQ(gpu.workloads.size(), 2u);
  EXPECT_EQ(gpu.workloads[0].first, "images");
  EXPECT_EQ(gpu.workloads[1].first, "tokens");
  ASSERT_EQ(gpu.runs.size(), 4u);
  EXPECT_EQ(gpu.runs[0].id(), "images/amp-bf16-single-x1");
  EXPECT_EQ(gpu.runs[0].run_id(), "amp-bf16-single-x1");
  EXPECT_EQ(gpu.runs[0].label(), "images amp-bf16, single, 1 device");
  EXPECT_EQ(gpu.runs[0].pytorch, (std::vector<std::string>{"eager", "compiled"}));
  EXPECT_TRUE(gpu.runs[1].ptrain);
  EXPECT_TRUE(gpu.runs[1].pytorch.empty()) << "pytorch: none";
  EXPECT_FALSE(gpu.runs[2].ptrain);
  EXPECT_EQ(gpu.runs[2].id(), gpu.runs[1].id()) << "the same run, asked again for its compiled job";
  EXPECT_EQ(gpu.runs[2].pytorch, std::vector<std::string>{"compiled"});
  EXPECT_EQ(gpu.runs[3].pytorch, std::vector<std::string>{"eager"});
  const auto& tokens = gpu.workload_of(gpu.runs[1]);
  EXPECT_NE(std::find(tokens.begin(), tokens.end(), std::pair<std::string, std::string>{"model", "gpt-tiny"}),
            tokens.end());

  const Suite cpu = load_suite(path, "/nonexistent", 0);
  ASSERT_EQ(cpu.workloads.size(), 1u) << "cpu-workloads replace the workloads";
  EXPECT_EQ(cpu.workloads[0].first, "small");
  ASSERT_EQ(cpu.runs.size(), 1u);
  EXPECT_EQ(cpu.runs[0].id(), "small/fp32-single-x1");
  EXPECT_EQ(cpu.runs[0].pytorch, (std::vector<std::string>{"compiled", "eager"}));
}

TEST(Suite, BadSeveralWorkloadSuitesAreNamedByFileAndKey) {
  const std::string two = "workloads:\n  a: {model: resnet20}\n  b: {model: gpt-tiny}\n";
  expect_refused(two + "runs: [{precision: fp32}]\n", {"runs[0]", "workload: NAME"});
  expect_refused(two + "runs: [{workload: c, precision: fp32}]\n", {"runs[0]", "no workload 'c'", "a, b"});
  expect_refused("workload: {model: resnet20}\nruns: [{workload: a, precision: fp32}]\n", {"runs[0]", "one workload"});
  expect_refused(two + "workload: {model: resnet20}\nruns: [{workload: a}]\n", {"not both"});
  expect_refused(two + "cpu-workload: {model: resnet20}\nruns: [{workload: a}]\n", {"'cpu-workload'", "cpu-workloads"});
  expect_refused("workload: {model: resnet20}\ncpu-workloads: {a: {model: resnet20}}\nruns: [{precision: fp32}]\n",
                 {"'cpu-workloads'"});
  expect_refused(two + "runs: [{workload: a, pytorch: [eager, jit]}]\n", {"runs[0]", "'pytorch'", "'jit'"});
  expect_refused(two + "runs: [{workload: a, pytorch: [eager, eager]}]\n", {"runs[0]", "'eager' twice"});
  expect_refused(two + "runs: [{workload: a, ptrain: false, pytorch: none}]\n", {"runs[0]", "runs nothing"});
  // The second entry asks again for a job the first one has: ptrain's run would be trained twice.
  expect_refused(two + "runs: [{workload: a, pytorch: eager}, {workload: a, pytorch: compiled}]\n",
                 {"runs[1]", "same run", "ptrain job", "runs[0]"});
  expect_refused(two + "runs: [{workload: a}, {workload: a, ptrain: false}]\n", {"runs[1]", "pytorch eager job"});
  expect_refused("workloads:\n  pytorch: {model: resnet20}\nruns: [{workload: pytorch}]\n", {"'pytorch'", "--skip"});
  expect_refused("workloads:\n  a/b: {model: resnet20}\nruns: [{workload: a/b}]\n", {"'a/b'"});
  expect_refused("workloads:\n  a: {model: resnet20, strategy: ddp}\nruns: [{workload: a}]\n", {"workloads: a", "'strategy'"});
  expect_refused("workloads: {}\nruns: [{precision: fp32}]\n", {"workloads"});
}

TEST(Suite, OverridesSetEveryWorkloadOrTheOneNamed) {
  TempDir dir;
  Suite several = load_suite(write(dir, kSeveral), "/nonexistent", 1);
  apply_overrides(several, {{"max-steps", "9"}, {"tokens/batch_size", "2"}});
  const auto value = [](const WorkloadKeys& w, const std::string& key) {
    for (const auto& [k, v] : w) {
      if (k == key) return v;
    }
    return std::string("(unset)");
  };
  EXPECT_EQ(value(several.workloads[0].second, "max-steps"), "9");
  EXPECT_EQ(value(several.workloads[1].second, "max-steps"), "9");
  EXPECT_EQ(value(several.workloads[0].second, "batch-size"), "8");
  EXPECT_EQ(value(several.workloads[1].second, "batch-size"), "2");
  try {
    apply_overrides(several, {{"nosuch/max-steps", "1"}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--set nosuch/max-steps=1: no workload 'nosuch'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("images, tokens"), std::string::npos) << e.what();
  }
  EXPECT_THROW(apply_overrides(several, {{"tokens/precision", "fp16"}}), Error);
  Suite one = load_suite("standard", PTRAIN_SOURCE_DIR, 1);
  try {
    apply_overrides(one, {{"resnet50/max-steps", "1"}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has one workload"), std::string::npos) << e.what();
  }
}

// The fp8 suite, by its name of three letters: GPT-2 XL and small, each in fp8 and amp-bf16, by ptrain and by
// PyTorch compiled with CUDA graphs.
// The fp8 suite is the speed suite's fp8 runs alone: the same workloads, the same jobs.
TEST(Suite, Fp8SuiteIsTheSpeedSuitesFp8RunsByItsShortName) {
  const Suite fp8 = load_suite("fp8", PTRAIN_SOURCE_DIR, 1);
  const Suite speed = load_suite("speed", PTRAIN_SOURCE_DIR, 1);
  EXPECT_EQ(fp8.pytorch_compile_mode, speed.pytorch_compile_mode);
  const auto jobs_of = [](const Suite& suite, bool fp8_workloads_only) {
    std::set<std::string> jobs;
    for (const auto& run : suite.runs) {
      if (fp8_workloads_only && run.workload != "gpt-xl" &&
          !(run.workload == "gpt2-small" && (run.precision == "fp8" || run.precision == "amp-bf16"))) {
        continue;
      }
      if (run.ptrain) jobs.insert("ptrain/" + run.id());
      for (const auto& variant : run.pytorch) {
        if (variant == "compiled") jobs.insert(variant + "/" + run.id());
      }
    }
    return jobs;
  };
  EXPECT_EQ(jobs_of(fp8, false),
            (std::set<std::string>{"ptrain/gpt-xl/amp-bf16-single-x1", "ptrain/gpt-xl/fp8-single-x1",
                                   "ptrain/gpt-xl/fp8-delayed-head-single-x1", "ptrain/gpt2-small/amp-bf16-single-x1",
                                   "ptrain/gpt2-small/fp8-single-x1", "ptrain/gpt2-small/fp8-delayed-head-single-x1",
                                   "compiled/gpt-xl/amp-bf16-single-x1", "compiled/gpt-xl/fp8-single-x1",
                                   "compiled/gpt2-small/amp-bf16-single-x1", "compiled/gpt2-small/fp8-single-x1"}));
  EXPECT_EQ(jobs_of(fp8, false), jobs_of(speed, true));
  for (const auto& run : fp8.runs) {
    EXPECT_EQ(fp8.workload_of(run), speed.workload_of(run)) << run.id();
    if (run.fp8_beyond_defaults()) EXPECT_TRUE(run.pytorch.empty()) << run.id() << ": the reference has no such recipe";
  }
}

// The speed suite: both models in every mode, each by ptrain, PyTorch eager and PyTorch compiled (with CUDA
// graphs: reduce-overhead) exactly once, AMP bf16 first and also in torch.compile's default mode; fp8 for GPT-2
// small and XL beside their amp-bf16, by ptrain and PyTorch compiled, and ptrain's delayed-scaling fp8; ResNet-50's batch sweep in AMP bf16,
// every run of it 30 steps; and a CPU variant that needs no GPU.
TEST(Suite, SpeedSuiteRunsBothModelsInEveryModeInAllThreeWithAmpBf16First) {
  const Suite gpu = load_suite("speed", PTRAIN_SOURCE_DIR, 1);
  ASSERT_EQ(gpu.workloads.size(), 3u);
  EXPECT_EQ(gpu.pytorch_compile_mode, "reduce-overhead");
  std::map<std::string, int> jobs;
  for (const auto& run : gpu.runs) {
    EXPECT_EQ(run.strategy, "single");
    if (run.ptrain) ++jobs["ptrain/" + run.id()];
    for (const auto& variant : run.pytorch) ++jobs[variant + "/" + run.id()];
  }
  for (const char* workload : {"resnet50", "gpt2-small"}) {
    for (const char* precision : {"fp32", "tf32", "fp16", "bf16", "amp-fp16", "amp-bf16"}) {
      const std::string id = std::string(workload) + "/" + precision + "-single-x1";
      for (const char* job : {"ptrain/", "eager/", "compiled/"}) EXPECT_EQ(jobs[job + id], 1) << job << id;
    }
    EXPECT_EQ(jobs[std::string("compiled-default/") + workload + "/amp-bf16-single-x1"], 1) << workload;
  }
  for (const char* batch : {"256", "400"}) {
    const std::string id = std::string("resnet50/amp-bf16-single-x1-b") + batch;
    for (const char* job : {"ptrain/", "eager/", "compiled/"}) EXPECT_EQ(jobs[job + id], 1) << job << id;
  }
  for (const char* id : {"gpt2-small/fp8-single-x1", "gpt-xl/fp8-single-x1", "gpt-xl/amp-bf16-single-x1"}) {
    for (const char* job : {"ptrain/", "compiled/"}) EXPECT_EQ(jobs[job + std::string(id)], 1) << job << id;
  }
  for (const char* id : {"gpt2-small/fp8-delayed-head-single-x1", "gpt-xl/fp8-delayed-head-single-x1"}) {
    EXPECT_EQ(jobs["ptrain/" + std::string(id)], 1) << id;
  }
  EXPECT_EQ(jobs.size(), 36u + 2u + 6u + 6u + 2u);
  ASSERT_GE(gpu.runs.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(gpu.runs[i].precision, "amp-bf16");
    EXPECT_EQ(gpu.runs[i].pytorch, (std::vector<std::string>{"eager", "compiled", "compiled-default"}));
  }
  const auto value = [](const WorkloadKeys& keys, const std::string& key) {
    for (const auto& [k, v] : keys) {
      if (k == key) return std::stoll(v);
    }
    return -1LL;
  };
  for (const auto& run : gpu.runs) {
    if (run.workload != "resnet50") continue;
    const WorkloadKeys keys = gpu.run_workload(run);
    EXPECT_EQ(value(keys, "train-limit"), value(keys, "max-steps") * value(keys, "batch-size"))
        << run.id() << ": every run trains its max-steps on distinct images";
  }
  const auto& resnet = gpu.workload_of(gpu.runs[0]);
  EXPECT_NE(std::find(resnet.begin(), resnet.end(), std::pair<std::string, std::string>{"channels-last", "true"}),
            resnet.end());
  const Suite cpu = load_suite("speed", PTRAIN_SOURCE_DIR, 0);
  ASSERT_EQ(cpu.workloads.size(), 2u);
  for (const auto& run : cpu.runs) {
    EXPECT_TRUE(run.precision == "fp32" || run.precision == "amp-bf16") << run.precision << ": the CPU has no fp16";
  }
}

}  // namespace
}  // namespace ptrain::bench
