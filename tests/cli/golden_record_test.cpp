// The run record of a few fixed-seed runs through the ptrain executable, compared byte for byte with the files
// under tests/cli/golden/: an fp32 run, pure bf16 with fp32 master weights and gradient accumulation, a run
// paused by --stop-at-step and its resume, and ddp on two gloo ranks. What is measured or belongs to the machine
// is taken out first (kMeasured below, each with why); every other value (losses, accuracies, steps, the config,
// the kernels, run_end) must match exactly, so that a change to how the run is put together that changes what
// it computes or records fails here. The bf16 runs' losses and accuracies depend on the CPU's bf16 kernels: they
// are held to the golden values within a tolerance, and the rest of those records exactly.
//
// After a change that is meant to alter a record: PTRAIN_UPDATE_GOLDEN=1 ./test_cli_golden rewrites the files
// from this build, and the diff shows what changed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "multiprocess.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kPtrain = PTRAIN_EXECUTABLE;
const fs::path kGoldenDir = fs::path(PTRAIN_SOURCE_DIR) / "tests" / "cli" / "golden";

// A tiny ResNet on synthetic images, one thread, evaluated at every epoch's end, its progress read (and
// divergence checked) every 3 steps: about a second a run.
const std::string kTinyRun =
    "train --model resnet20 --dataset synthetic --data-path 96:3x8x8:4 --batch-size 8 --train-limit 64 "
    "--test-limit 16 --epochs 2 --eval-each-epoch --log-every 3 --device cpu --threads 1 --seed 5 --progress none";

// JSON pointers of what a run measures or takes from the machine it runs on, removed before comparing.
const std::vector<std::string> kMeasured = {
    "/torch_version",                // the LibTorch this build links
    "/environment",                  // host, CPU, compiler, the source commit
    "/total_wall_seconds",           // times
    "/train_wall_seconds",
    "/checkpoint_blocking_seconds",
    "/checkpoint_write_seconds",
    "/step_phase_seconds",
    "/steady_step_seconds",
    "/steady_step_median_seconds",
    "/steady_step_p10_seconds",
    "/steady_step_p90_seconds",
    "/extra/checkpoint_blocking",
    "/extra/data_loader/wait_seconds",
    "/extra/data_loader/wait_fraction",
    "/images_per_second",            // rates: work over a measured time
    "/steady_images_per_second",
    "/tokens_per_second",
    "/steady_tokens_per_second",
    "/tflops",
    "/mfu",
    "/peak_tflops",                  // the machine's peak, as found on the host it runs on
    "/peak_tflops_basis",
    "/host_peak_rss_bytes",          // memory as the process and the allocator saw it
    "/peak_allocated_bytes",
    "/peak_reserved_bytes",
    "/peak_nvml_used_bytes",
    "/gpu_util_mean",
    "/gpu_util_peak",
};
// Per epoch: its time and the rate over it.
const std::vector<std::string> kMeasuredPerEpoch = {"wall_seconds", "images_per_second"};

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The record with kMeasured removed, as the golden file holds it. The command line names the executable by
// its path in the build tree: it reads "ptrain" here.
std::string comparable(const fs::path& record_file) {
  json record = json::parse(read_text(record_file));
  for (const auto& pointer : kMeasured) {
    const json::json_pointer where(pointer);
    if (record.contains(where)) record.at(where.parent_pointer()).erase(where.back());
  }
  for (auto& epoch : record.at("epochs_detail"))
    for (const auto& key : kMeasuredPerEpoch) epoch.erase(key);
  std::string command_line = record.at("command_line").get<std::string>();
  if (command_line.rfind(kPtrain, 0) == 0) command_line = "ptrain" + command_line.substr(kPtrain.size());
  record["command_line"] = command_line;
  return record.dump(2) + "\n";
}

bool updating() {
  const char* update = std::getenv("PTRAIN_UPDATE_GOLDEN");
  return update != nullptr && std::string(update) == "1";
}

// The losses and accuracies of a bf16 run on the CPU depend on the CPU: LibTorch runs bf16 convolutions through
// oneDNN, whose kernels differ by instruction set (native bf16 dot products on AVX512-BF16, fp32 emulation on
// AVX512, LibTorch's own path without AVX512), each rounding its sums its own way. Seen: the same build gave
// final test losses of 0.7831 and 0.8762 for the amp-bf16 run on two machines, everything else equal.
const std::vector<std::string> kCpuDependentTopLevel = {"final_test_loss", "final_test_accuracy"};
const std::vector<std::string> kCpuDependentPerEpoch = {"test_loss", "train_loss", "test_accuracy", "train_accuracy"};

// Moves the CPU-dependent numbers of a comparable record out of it, into a flat list in a fixed order.
std::vector<double> take_cpu_dependent(json& record) {
  std::vector<double> taken;
  for (const auto& key : kCpuDependentTopLevel) {
    taken.push_back(record.at(key).get<double>());
    record.erase(key);
  }
  for (auto& epoch : record.at("epochs_detail"))
    for (const auto& key : kCpuDependentPerEpoch) {
      taken.push_back(epoch.at(key).get<double>());
      epoch.erase(key);
    }
  return taken;
}

// cpu_dependent: the run's losses and accuracies depend on the CPU (a bf16 run): everything else must match
// exactly, and those within 25% of the golden record's (accuracies within 0.25), which a run that diverged, or
// trained on other data or another model, would not keep.
void expect_matches_golden(const fs::path& record_file, const std::string& golden_name, bool cpu_dependent = false) {
  ASSERT_TRUE(fs::exists(record_file)) << record_file << " was not written";
  const std::string actual = comparable(record_file);
  const fs::path golden = kGoldenDir / golden_name;
  if (updating()) {
    std::ofstream(golden) << actual;
    std::cout << "rewrote " << golden.string() << std::endl;
    return;
  }
  ASSERT_TRUE(fs::exists(golden)) << golden << " is missing: PTRAIN_UPDATE_GOLDEN=1 writes it";
  const std::string hint = "the record of " + golden_name + " changed (" + record_file.string() +
                           "); if on purpose, PTRAIN_UPDATE_GOLDEN=1 rewrites it";
  if (!cpu_dependent) {
    EXPECT_EQ(read_text(golden), actual) << hint;
    return;
  }
  json want = json::parse(read_text(golden)), got = json::parse(actual);
  const std::vector<double> want_numbers = take_cpu_dependent(want), got_numbers = take_cpu_dependent(got);
  EXPECT_EQ(want.dump(2), got.dump(2)) << hint;
  ASSERT_EQ(want_numbers.size(), got_numbers.size()) << hint;
  for (size_t i = 0; i < want_numbers.size(); ++i) {
    EXPECT_TRUE(std::isfinite(got_numbers[i])) << hint << ": value " << i;
    EXPECT_NEAR(got_numbers[i], want_numbers[i], std::max(0.25, 0.25 * std::abs(want_numbers[i])))
        << hint << ": value " << i << " (losses and accuracies in record order)";
  }
}

// `ptrain args` run in dir, so that the paths the record and its config name are relative and the same each time.
ptrain::testing::CommandResult run_in(const ptrain::testing::TempDir& dir, const std::string& args) {
  return ptrain::testing::run_command("cd " + dir.path() + " && " + kPtrain + " " + args);
}

// The tiny run with flags, its record (written to record, a name the record keeps) compared with the golden file.
void expect_tiny_run_matches_golden(const std::string& flags, const std::string& record, const std::string& golden,
                                    bool cpu_dependent = false) {
  ptrain::testing::TempDir dir;
  const auto r = run_in(dir, kTinyRun + flags + " --metrics-out " + record);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_matches_golden(dir.file(record), golden, cpu_dependent);
}

TEST(GoldenRecord, Fp32) { expect_tiny_run_matches_golden("", "fp32.json", "fp32.json"); }

TEST(GoldenRecord, Bf16WithMasterWeightsAndAccumulation) {
  expect_tiny_run_matches_golden(" --precision bf16 --master-weights --grad-accum 2 --clip-grad-norm 1", "bf16.json",
                                 "bf16_master_weights_accum.json", /*cpu_dependent=*/true);
}

TEST(GoldenRecord, AmpBf16WithAccumulation) {
  expect_tiny_run_matches_golden(" --precision amp-bf16 --grad-accum 2", "amp.json", "amp_bf16_accum.json",
                                 /*cpu_dependent=*/true);
}

// Paused after step 5 of 16 with its checkpoint, then resumed to the end (a checkpoint every 3 steps): both records.
TEST(GoldenRecord, PausedAndResumed) {
  ptrain::testing::TempDir dir;
  const std::string run = kTinyRun + " --checkpoint-dir ck --checkpoint-every 3";
  const auto paused = run_in(dir, run + " --stop-at-step 5 --metrics-out paused.json");
  ASSERT_EQ(paused.exit_code, 0) << paused.output;
  expect_matches_golden(dir.file("paused.json"), "paused.json");
  const auto resumed = run_in(dir, run + " --resume latest --metrics-out resumed.json");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  expect_matches_golden(dir.file("resumed.json"), "resumed.json");
}

// Rank 0 writes the record (every rank is given a file name of its own, in case that changes).
TEST(GoldenRecord, DdpOnTwoGlooRanks) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  ptrain::testing::TempDir dir;
  const auto r = ptrain::testing::run_command("cd " + dir.path() + " && " + kPtrain +
                                              " launch --nproc-per-node 2 --timeout 120 -- bash -c 'exec " + kPtrain +
                                              " " + kTinyRun + " --strategy ddp --dist-timeout 60 --log-all-ranks" +
                                              " --metrics-out ddp_rank$RANK.json'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_matches_golden(dir.file("ddp_rank0.json"), "ddp_rank0.json");
  EXPECT_FALSE(fs::exists(dir.file("ddp_rank1.json")));
}

}  // namespace
