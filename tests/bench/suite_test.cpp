// Suites: what a user's YAML says is what runs, and what it gets wrong is named by file and key.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "ptrain/bench/suite.h"
#include "ptrain/core/error.h"
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
}

TEST(Suite, UnknownSuiteNamesTheFileItLookedFor) {
  try {
    load_suite("nosuch", "/src", 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/src/configs/bench/nosuch.yaml"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ptrain::bench
