// --tensorboard and --log-jsonl through the ptrain executable: a tiny run's event file (decoded by the test's
// own reader), its JSON lines and its progress output agree step by step, and evaluation comes once an epoch.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "command.h"
#include "event_file_reader.h"
#include "remove_tree.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;

using Result = ptrain::testing::CommandResult;

Result run(const std::string& args) { return ptrain::testing::run_command(std::string(PTRAIN_EXECUTABLE) + " " + args); }

fs::path scratch(const std::string& name) { return ptrain::testing::fresh_named_dir("scalar_logs_" + name); }

// 128 samples in batches of 16: 8 steps an epoch, progress (and the logs) every 4 steps and at each epoch's end.
// The step schedule halves the rate after the first epoch.
const std::string kTinyRun =
    "train --model resnet20 --dataset synthetic --data-path 128:3x16x16:4 --batch-size 16 --epochs 2 --device cpu "
    "--threads 2 --progress lines --log-every 4 --test-limit 32 --lr 0.05 --schedule step --milestones 1 --gamma 0.5 "
    "--clip-grad-norm 100 ";

TEST(ScalarLogs, EventFileJsonLinesAndProgressAgreeStepByStepWithEvaluationEachEpoch) {
  const auto dir = scratch("train");
  const auto tensorboard = dir / "tb";
  const auto jsonl = dir / "logs" / "run.jsonl";
  const auto metrics = dir / "run.json";
  // The two outputs as YAML keys, as a --config file gives them.
  std::ofstream(dir / "logs.yaml") << "tensorboard: " << tensorboard.string() << "\nlog_jsonl: " << jsonl.string() << "\n";
  const Result r = run(kTinyRun + "--config " + (dir / "logs.yaml").string() + " --metrics-out " + metrics.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // The progress lines' window losses, "epoch 1/2 step 4/8  ... loss 1.3912", by global step.
  std::map<int64_t, double> printed_loss;
  const std::regex progress_line(R"(epoch (\d+)/2 step (\d+)/8 .* loss ([0-9.]+))");
  std::istringstream lines_out(r.output);
  for (std::string line; std::getline(lines_out, line);) {
    std::smatch m;
    if (std::regex_search(line, m, progress_line))
      printed_loss[(std::stoll(m[1]) - 1) * 8 + std::stoll(m[2])] = std::stod(m[3]);
  }
  ASSERT_EQ(printed_loss.size(), 4u) << r.output;

  std::vector<nlohmann::json> steps, epochs;
  {
    std::ifstream in(jsonl);
    ASSERT_TRUE(in.good()) << "no " << jsonl;
    for (std::string line; std::getline(in, line);) {
      const auto record = nlohmann::json::parse(line);
      (record["kind"] == "step" ? steps : epochs).push_back(record);
    }
  }
  ASSERT_EQ(steps.size(), 4u);
  ASSERT_EQ(epochs.size(), 2u);
  const std::vector<int64_t> logged_steps{4, 8, 12, 16};
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& s = steps[i];
    EXPECT_EQ(s["step"], logged_steps[i]);
    EXPECT_DOUBLE_EQ(s["epoch"].get<double>(), logged_steps[i] / 8.0);
    EXPECT_NEAR(s["train/loss"].get<double>(), printed_loss.at(logged_steps[i]), 5.1e-5) << s.dump();
    // The rate the logged step ran at: step 8 is the first epoch's last, at --lr; step 12 is after the milestone.
    EXPECT_DOUBLE_EQ(s["train/lr"].get<double>(), logged_steps[i] <= 8 ? 0.05 : 0.025) << s.dump();
    EXPECT_GT(s["train/grad_norm"].get<double>(), 0.0) << s.dump();
    EXPECT_TRUE(std::isfinite(s["train/grad_norm"].get<double>())) << s.dump();
    EXPECT_GT(s["train/images_per_s"].get<double>(), 0.0) << s.dump();
    EXPECT_GT(s["memory/peak_allocated_gib"].get<double>(), 0.0) << s.dump();
    EXPECT_FALSE(s.contains("train/loss_scale")) << "fp32 has no loss scaler: " << s.dump();
    if (i > 0) {
      EXPECT_GE(s["wall_time"].get<double>(), steps[i - 1]["wall_time"].get<double>());
    }
  }

  // Each epoch's evaluation, as the run record has it.
  std::ifstream metrics_in(metrics);
  const auto record = nlohmann::json::parse(metrics_in);
  ASSERT_EQ(record["epochs_detail"].size(), 2u);
  for (size_t e = 0; e < 2; ++e) {
    const auto& detail = record["epochs_detail"][e];
    EXPECT_EQ(epochs[e]["step"], 8 * static_cast<int64_t>(e + 1));
    EXPECT_DOUBLE_EQ(epochs[e]["epoch"].get<double>(), e + 1.0);
    EXPECT_DOUBLE_EQ(epochs[e]["eval/accuracy"].get<double>(), detail["test_accuracy"].get<double>());
    EXPECT_DOUBLE_EQ(epochs[e]["eval/loss"].get<double>(), detail["test_loss"].get<double>());
    EXPECT_DOUBLE_EQ(epochs[e]["train/epoch_loss"].get<double>(), detail["train_loss"].get<double>());
  }

  // The event file: the same records, the scalars in float32.
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(tensorboard)) files.push_back(entry.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].filename().string().rfind("events.out.tfevents.", 0), 0u) << files[0];
  const auto events = ptrain::testing::read_event_file(files[0].string());
  ASSERT_EQ(events.size(), 1u + steps.size() + epochs.size());
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  std::vector<nlohmann::json> in_order = {steps[0], steps[1], epochs[0], steps[2], steps[3], epochs[1]};
  for (size_t i = 0; i < in_order.size(); ++i) {
    const auto& event = events[i + 1];
    const auto& json = in_order[i];
    EXPECT_EQ(event.step, json["step"].get<int64_t>()) << i;
    EXPECT_DOUBLE_EQ(event.wall_time, json["wall_time"].get<double>()) << i;
    ASSERT_EQ(event.scalars.size(), json.size() - 4) << json.dump();  // all but kind, step, epoch, wall_time
    for (const auto& scalar : event.scalars) {
      ASSERT_TRUE(json.contains(scalar.tag)) << scalar.tag << " not in " << json.dump();
      EXPECT_EQ(scalar.value, static_cast<float>(json[scalar.tag].get<double>())) << scalar.tag;
    }
  }
  ptrain::testing::remove_tree(dir);
}

TEST(ScalarLogs, OutputsThatCannotBeWrittenAreRefusedBeforeTrainingInOneLine) {
  const auto dir = scratch("refused");
  std::ofstream(dir / "a_file") << "x";
  fs::create_directories(dir / "a_directory");
  const std::vector<std::pair<std::string, std::string>> cases{
      {"--tensorboard " + (dir / "a_file").string(),
       "ptrain: error: --tensorboard " + (dir / "a_file").string() + ": is a file, not a directory"},
      {"--tensorboard " + (dir / "a_file" / "tb").string(),
       "ptrain: error: --tensorboard " + (dir / "a_file" / "tb").string() + ": cannot be created"},
      {"--log-jsonl " + (dir / "a_directory").string(),
       "ptrain: error: --log-jsonl " + (dir / "a_directory").string() + ": is a directory, not a file"},
  };
  for (const auto& [flags, expected] : cases) {
    const Result r = run(kTinyRun + flags);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.rfind(expected, 0), 0u) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
  const Result help = run("train --help");
  EXPECT_NE(help.output.find("--tensorboard"), std::string::npos);
  EXPECT_NE(help.output.find("--log-jsonl"), std::string::npos);
  ptrain::testing::remove_tree(dir);
}

}  // namespace
