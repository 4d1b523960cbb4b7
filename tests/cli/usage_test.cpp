// What the ptrain executable tells a user about its flags and how it ends: --help prints every flag's
// default as a run without the flag records it, in lines of at most 100 columns; every usage error is one
// "ptrain: error:" line naming the flag, command or PTRAIN_* variable, with near names for a typo, and exit
// code 2; each class of exit code README lists; `ptrain estimate` for a CUDA config on a machine without one.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "command.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;

using Result = ptrain::testing::CommandResult;  // output: stdout and stderr together

int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

Result run_shell(const std::string& command_line) { return ptrain::testing::run_command(command_line); }

const std::string kPtrain = PTRAIN_EXECUTABLE;

Result run(const std::string& args) { return run_shell(kPtrain + " " + args); }

fs::path scratch(const std::string& name) { return ptrain::testing::fresh_named_dir("usage_" + name); }

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// --help's options: flag -> the whole entry (its lines joined by single spaces).
std::map<std::string, std::string> help_entries(const std::string& help) {
  std::map<std::string, std::string> entries;
  std::string flag;
  for (const auto& line : lines_of(help)) {
    if (line.rfind("  -", 0) == 0) {
      std::istringstream words(line);
      words >> flag;
      if (!flag.empty() && flag.back() == ',') flag.pop_back();
      if (flag == "-h") flag = "--help";
      entries[flag] = line;
    } else if (!flag.empty() && line.rfind("    ", 0) == 0) {
      entries[flag] += " " + line;
    } else {
      flag.clear();
    }
  }
  for (auto& [name, entry] : entries) entry = std::regex_replace(entry, std::regex(" +"), " ");
  return entries;
}

// The "(default: X)" an entry ends with; "" when it has none.
std::string default_in(const std::string& entry) {
  const auto at = entry.rfind("(default: ");
  if (at == std::string::npos) return "";
  const auto end = entry.find(')', at);
  return entry.substr(at + 10, end - at - 10);
}

// A run record's extra.config as setting -> value, and the flag each setting has.
void flatten(const nlohmann::json& node, const std::string& prefix, std::map<std::string, nlohmann::json>& out) {
  if (!node.is_object()) {
    out[prefix] = node;
    return;
  }
  for (auto it = node.begin(); it != node.end(); ++it) flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
}

std::string flag_of(const std::string& setting) {
  static const std::map<std::string, std::string> named_otherwise{{"model.name", "--model"},
                                                                  {"optimizer.name", "--optimizer"},
                                                                  {"data.path", "--data-path"},
                                                                  {"dist.timeout_seconds", "--dist-timeout"}};
  if (const auto it = named_otherwise.find(setting); it != named_otherwise.end()) return it->second;
  std::string flag = "--" + setting.substr(setting.find('.') + 1);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

// The value as help writes a default: true/false, numbers as written, "unset" for an empty text or list.
bool same_value(const nlohmann::json& recorded, const std::string& help) {
  if (recorded.is_boolean()) return help == (recorded.get<bool>() ? "true" : "false");
  if (recorded.is_number()) {
    try {
      return std::stod(help) == recorded.get<double>();
    } catch (const std::exception&) {
      return false;
    }
  }
  if (recorded.is_string()) return recorded.get<std::string>().empty() ? help == "unset" : help == recorded.get<std::string>();
  if (recorded.is_array()) return recorded.empty() && help == "unset";
  return false;
}

TEST(Usage, HelpPrintsTheDefaultEveryRunWithoutTheFlagRecords) {
  const Result help = run("train --help");
  ASSERT_EQ(help.exit_code, 0) << help.output;
  const auto entries = help_entries(help.output);
  ASSERT_GT(entries.size(), 90u) << help.output;

  // Two short runs, each given a few flags to be short, so that every flag is left at its default by one of
  // them: the first trains a small model on synthetic data, the second the default model on the default
  // dataset, a few of its samples.
  const fs::path fashion_mnist = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(fashion_mnist / "train-images-idx3-ubyte.gz")) GTEST_SKIP() << "no Fashion-MNIST at " << fashion_mnist;
  const auto dir = scratch("defaults");
  const std::string small_model = (dir / "small.json").string(), default_model = (dir / "default.json").string();
  const Result first = run("train --model resnet20 --dataset synthetic --data-path 64:3x8x8:4 --batch-size 8 "
                           "--max-steps 1 --metrics-out " + small_model);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const Result second = run("train --train-limit 128 --test-limit 128 --metrics-out " + default_model);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const std::vector<std::pair<std::string, std::set<std::string>>> runs{
      {small_model, {"--model", "--dataset", "--data-path", "--batch-size", "--max-steps", "--metrics-out"}},
      {default_model, {"--train-limit", "--test-limit", "--metrics-out"}}};

  std::set<std::string> compared;
  for (const auto& [record_path, given] : runs) {
    std::map<std::string, nlohmann::json> settings;
    flatten(nlohmann::json::parse(std::ifstream(record_path))["extra"]["config"], "", settings);
    ASSERT_GT(settings.size(), 90u) << record_path;
    for (const auto& [setting, value] : settings) {
      const std::string flag = flag_of(setting);
      ASSERT_EQ(entries.count(flag), 1u) << setting << " is recorded, but help has no " << flag;
      if (given.count(flag) != 0) continue;
      const std::string shown = default_in(entries.at(flag));
      ASSERT_FALSE(shown.empty()) << flag << " shows no default: " << entries.at(flag);
      compared.insert(flag);
      if (flag == "--threads") {
        // 0 is resolved by the run to the threads it got; help says what 0 means.
        EXPECT_EQ(shown, "0") << entries.at(flag);
        EXPECT_GE(value.get<int64_t>(), 1);
        EXPECT_NE(entries.at(flag).find("0: "), std::string::npos) << entries.at(flag);
        continue;
      }
      EXPECT_TRUE(same_value(value, shown)) << flag << ": help says " << shown << ", the run recorded " << value.dump();
    }
  }
  // Every flag but the ones no record holds (help, the config file, the dry run, the record itself).
  for (const auto& [flag, entry] : entries) {
    if (flag == "--help" || flag == "--config" || flag == "--dry-run" || flag == "--metrics-out") continue;
    EXPECT_EQ(compared.count(flag), 1u) << flag << " is in help but in no run record: " << entry;
  }
  // The defaults the old help misstated, checked by name.
  for (const char* flag : {"--eval-each-epoch", "--augment", "--cuda-graphs", "--fused-kernels", "--relu-recompute",
                           "--conv-bn-fusion", "--overlap-comm", "--sync-module-states"})
    EXPECT_EQ(default_in(entries.at(flag)), "true") << entries.at(flag);
  EXPECT_EQ(default_in(entries.at("--warmup-epochs")), "0");
  EXPECT_EQ(default_in(entries.at("--min-lr")), "0");
  EXPECT_EQ(default_in(entries.at("--beta1")), "0.9");
}

TEST(Usage, EveryHelpLineFitsIn100Columns) {
  for (const char* command : {"", "train ", "estimate ", "launch ", "bench ", "report ", "verify "}) {
    const Result help = run(std::string(command) + "--help");
    ASSERT_EQ(help.exit_code, 0) << command << help.output;
    for (const auto& line : lines_of(help.output)) EXPECT_LE(line.size(), 100u) << "ptrain " << command << "--help: " << line;
  }
}

// One line, "ptrain: error: " and what it must say, exit 2.
void expect_usage_error(const std::string& command_line, const std::string& expected) {
  const Result r = run_shell(command_line);
  EXPECT_EQ(r.exit_code, 2) << command_line << "\n" << r.output;
  const auto lines = lines_of(r.output);
  ASSERT_EQ(lines.size(), 1u) << command_line << "\n" << r.output;
  EXPECT_EQ(lines.front().rfind("ptrain: error: ", 0), 0u) << r.output;
  EXPECT_NE(lines.front().find(expected), std::string::npos) << command_line << "\n" << r.output;
}

TEST(Usage, EveryUsageErrorIsOneLineNamingTheFlagCommandOrVariableAndExits2) {
  const std::string data = " --model resnet20 --dataset synthetic --data-path 64:3x8x8:4 --batch-size 8 --dry-run";
  expect_usage_error(kPtrain + " train --batch-size 0", "--batch-size: must be greater than 0, not 0");
  expect_usage_error(kPtrain + " train --batch-sze 3", "ptrain train has no flag --batch-sze (did you mean --batch-size?)");
  expect_usage_error(kPtrain + " train --warmup=2",
                     "(did you mean --warmup-epochs, --warmup-min-lr or --warmup-steps?)");
  expect_usage_error(kPtrain + " train --bogus", "ptrain train has no flag --bogus; ptrain train --help lists its flags");
  expect_usage_error(kPtrain + " estimate --batch-sze 3", "ptrain estimate has no flag --batch-sze (did you mean --batch-size?)");
  expect_usage_error(kPtrain + " trian --epochs 1", "'trian' is not a ptrain command (did you mean train?)");
  expect_usage_error(kPtrain, "a command is required: train, launch, report, bench, estimate, verify");
  expect_usage_error(kPtrain + " launch --nproc-per-node 0 -- true", "--nproc-per-node: must be greater than 0, not 0");
  // Thousands of ranks on a few cores kept forking for minutes, deaf to SIGTERM: refused before any starts.
  expect_usage_error(kPtrain + " launch --nproc-per-node 1500 -- sleep 30",
                     "--nproc-per-node 1500 is more processes than this node's");
  const auto accelerate_dir = scratch("accelerate_processes");
  std::ofstream(accelerate_dir / "many.yaml") << "distributed_type: MULTI_CPU\nnum_processes: 100000\n";
  expect_usage_error(kPtrain + " launch --config " + (accelerate_dir / "many.yaml").string() + " -- sleep 30",
                     "many.yaml: key 'num_processes' 100000 is more processes than this node's");
  expect_usage_error(kPtrain + " train --precision fp9", "--precision");
  expect_usage_error(kPtrain + " train --precision fp8 --device cpu" + data,
                     "--precision fp8 needs a CUDA GPU of compute capability 8.9 or later");
  expect_usage_error(kPtrain + " estimate --precision fp8 --device cpu" + data.substr(0, data.size() - 10),
                     "--precision fp8 needs a CUDA GPU");
  expect_usage_error(kPtrain + " train --precision amp-bf16 --fp8-head" + data,
                     "--fp8-head applies to --precision fp8 only, not to --precision amp-bf16");
  expect_usage_error(kPtrain + " train --precision amp-bf16 --fp8-scaling delayed" + data,
                     "--fp8-scaling delayed applies to --precision fp8 only, not to --precision amp-bf16");
  expect_usage_error(kPtrain + " train --precision fp8 --fp8-scaling late" + data, "--fp8-scaling");
  // A value from the environment names its variable; the command line's own value wins over it.
  expect_usage_error("PTRAIN_LR=abc " + kPtrain + " train" + data,
                     "PTRAIN_LR=abc: 'abc' is not a number (the environment variable PTRAIN_LR sets --lr)");
  expect_usage_error("PTRAIN_AUGMENT=maybe " + kPtrain + " train" + data, "PTRAIN_AUGMENT");
  expect_usage_error("PTRAIN_LR=0.5 " + kPtrain + " train --lr abc" + data, "--lr: 'abc' is not a number");
  const Result overridden = run_shell("PTRAIN_LR=abc " + kPtrain + " train --lr 0.05" + data);
  EXPECT_EQ(overridden.exit_code, 0) << overridden.output;
  // Another command than train reads no train variable (estimate's --lr refused PTRAIN_LR=abc for all).
  const Result other = run_shell("PTRAIN_LR=abc " + kPtrain + " verify /nonexistent/step.safetensors");
  EXPECT_EQ(other.output.find("PTRAIN_LR"), std::string::npos) << other.output;
  EXPECT_EQ(other.output.find("--lr"), std::string::npos) << other.output;
  // A --config key, near a known one or not.
  const auto dir = scratch("errors");
  std::ofstream(dir / "typo.yaml") << "batch_sze: 8\n";
  expect_usage_error(kPtrain + " train --config " + (dir / "typo.yaml").string(),
                     "typo.yaml: key 'batch_sze' is not a ptrain train option (did you mean batch-size?)");
  // The loader benchmark's flags are refused the same way.
  const std::string loader_bench = (fs::path(kPtrain).parent_path() / "ptrain-loader-bench").string();
  if (fs::exists(loader_bench)) {
    const Result r = run_shell(loader_bench + " --data-path /nonexistent --bogus");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(lines_of(r.output).size(), 1u) << r.output;
    EXPECT_EQ(r.output.rfind("ptrain-loader-bench: error: ", 0), 0u) << r.output;
  }
}

// README's exit codes, one case of each class: 0 done, 1 a job that ran but failed as a whole (ptrain
// launch past --timeout; ptrain bench's failed runs: Cli.BenchKeepsGoingPastAFailingRunAndNamesIt),
// 2 a named error, 3 LibTorch's own (CliUser tests a model whose forward fails), 128 + N a signal.
TEST(Usage, ExitCodesAreTheDocumentedOnes) {
  EXPECT_EQ(run("--version").exit_code, 0);
  EXPECT_EQ(run("train --help").exit_code, 0);
  const auto dir = scratch("exit_codes");
  const std::string run_args = "train --model resnet20 --dataset synthetic --data-path 64:3x8x8:4 --batch-size 8 "
                               "--device cpu --threads 1 --progress none --test-limit 8 ";
  EXPECT_EQ(run(run_args + "--max-steps 1").exit_code, 0);
  // A named error once training has begun: the checkpoint to resume is not one.
  std::ofstream(dir / "not-a-checkpoint.safetensors") << "not a checkpoint";
  const Result refused = run(run_args + "--resume " + (dir / "not-a-checkpoint.safetensors").string());
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("ptrain: error: "), std::string::npos) << refused.output;
  // ptrain launch: a rank's own code, a signal's 128 + N, 1 past --timeout.
  EXPECT_EQ(run("launch --nproc-per-node 1 -- bash -c 'exit 7'").exit_code, 7);
  EXPECT_EQ(run("launch --nproc-per-node 1 -- bash -c 'kill -TERM $$'").exit_code, 143);
  const Result timed_out = run("launch --nproc-per-node 1 --timeout 1 -- sleep 30");
  EXPECT_EQ(timed_out.exit_code, 1) << timed_out.output;
  EXPECT_NE(timed_out.output.find("exceeded --timeout"), std::string::npos) << timed_out.output;

  // Ctrl-C: the run stops at a step boundary, saves it and exits 130 (SIGTERM's 143: RunEnd's tests).
  const std::string log = (dir / "interrupted.log").string();
  const std::string command = "exec " + kPtrain + " " + run_args + "--epochs 50 --checkpoint-every 2 --checkpoint-dir " +
                              (dir / "checkpoints").string() + " > " + log + " 2>&1";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/bash", "bash", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(dir / "checkpoints" / "step-00000002.safetensors") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ::kill(pid, SIGINT);
  int status = 0;
  ::waitpid(pid, &status, 0);
  std::ifstream in(log);
  const std::string output((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(exit_code_of(status), 130) << output;
  EXPECT_NE(output.find("continue with the same command and --resume latest"), std::string::npos) << output;
}

// Estimating is arithmetic and short probe runs: a config that names a CUDA device is estimated on a machine
// without one, saying so, as README's `ptrain estimate --config configs/...` is.
TEST(Usage, EstimateForACudaDeviceWorksWithoutOne) {
  const std::string job = "estimate --model resnet20 --dataset synthetic --data-path 64:3x8x8:4 --batch-size 16 --devices 2 ";
  const auto dir = scratch("estimate");
  const std::string json = (dir / "estimate.json").string();
  const Result cuda = run(job + "--device cuda --precision amp-fp16 --json " + json);
  const Result cpu = run(job + "--device cpu --precision amp-bf16");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  if (cuda.output.find("note: ") == std::string::npos) {
    // A machine with a GPU estimates on it, with no note.
    EXPECT_EQ(cuda.exit_code, 0) << cuda.output;
    GTEST_SKIP() << "this machine runs CUDA: nothing to stand in for";
  }
  ASSERT_EQ(cuda.exit_code, 0) << cuda.output;
  EXPECT_NE(cuda.output.find("note: estimated for cuda, which this machine cannot run"), std::string::npos) << cuda.output;
  EXPECT_NE(cuda.output.find("--device cpu estimates for this machine's CPU"), std::string::npos) << cuda.output;
  EXPECT_NE(cuda.output.find("amp-fp16, batch 16 per device, on cuda"), std::string::npos) << cuda.output;
  const auto estimate = nlohmann::json::parse(std::ifstream(json));
  EXPECT_EQ(estimate["device"], "cuda");
  EXPECT_EQ(estimate["precision"], "amp-fp16");
  EXPECT_TRUE(estimate["capacity_bytes"].is_null()) << "a GPU's memory cannot be known without one";
  // ResNet-20's model states under single: fp32 weights, gradients and momentum, whatever device.
  const auto parameters = estimate["parameters"].get<int64_t>();
  EXPECT_GT(parameters, 250000);
  EXPECT_LT(parameters, 300000);
  for (const auto& s : estimate["strategies"]) {
    if (s["strategy"] != "single") continue;
    EXPECT_EQ(s["params_bytes"].get<int64_t>(), 4 * parameters);
    EXPECT_EQ(s["optimizer_bytes"].get<int64_t>(), 4 * parameters);
  }
  // On CUDA, dp's replicas each hold their own model states; on the CPU they share the host's memory.
  const auto dp_cuda = std::find_if(estimate["strategies"].begin(), estimate["strategies"].end(),
                                    [](const auto& s) { return s["strategy"] == "dp"; });
  ASSERT_NE(dp_cuda, estimate["strategies"].end());
  EXPECT_EQ((*dp_cuda)["params_bytes"].get<int64_t>(), 4 * parameters) << dp_cuda->dump();
  // fp8 is estimated as trained: amp-bf16's model states (fp32 parameters, gradients and AdamW moments), the
  // activations probed in amp-bf16 here (measured in FP8 on the GPU).
  const std::string gpt = "estimate --model gpt-tiny --dataset synthetic-tokens --data-path 64:32:256 --batch-size 8 "
                          "--optimizer adamw --device cuda ";
  const Result fp8 = run(gpt + "--precision fp8 --fp8-head --fp8-scaling delayed --json " + json);
  ASSERT_EQ(fp8.exit_code, 0) << fp8.output;
  EXPECT_NE(fp8.output.find("measured on the CPU in amp-bf16"), std::string::npos) << fp8.output;
  const auto fp8_estimate = nlohmann::json::parse(std::ifstream(json));
  EXPECT_EQ(fp8_estimate["precision"], "fp8");
  const Result bf16 = run(gpt + "--precision amp-bf16 --json " + json);
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  const auto bf16_estimate = nlohmann::json::parse(std::ifstream(json));
  for (size_t i = 0; i < fp8_estimate["strategies"].size(); ++i) {
    for (const char* key : {"params_bytes", "grads_bytes", "optimizer_bytes"}) {
      EXPECT_EQ(fp8_estimate["strategies"][i][key], bf16_estimate["strategies"][i][key])
          << fp8_estimate["strategies"][i]["strategy"] << " " << key;
    }
  }
  // Training still refuses a device it cannot use.
  const Result train = run("train --model resnet20 --dataset synthetic --data-path 64:3x8x8:4 --device cuda --dry-run");
  EXPECT_EQ(train.exit_code, 2) << train.output;
  EXPECT_NE(train.output.find("--device cuda: this ptrain was built against a LibTorch without CUDA"), std::string::npos)
      << train.output;
}

}  // namespace
