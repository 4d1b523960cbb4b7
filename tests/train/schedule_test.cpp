#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "ptrain/config/cli_options.h"
#include "ptrain/config/deepspeed_config.h"
#include "ptrain/train/plan.h"
#include "ptrain/train/schedule.h"
#include "test_support.h"

namespace {

ptrain::config::OptimizerConfig base() {
  ptrain::config::OptimizerConfig c;
  c.lr = 0.4;
  return c;
}

TEST(LrSchedule, CosineStartsAtPeakAndEndsAtFloor) {
  auto c = base();
  c.schedule = "cosine";
  c.min_lr = 0.0;
  ptrain::train::LrSchedule s(ptrain::train::schedule_options(c), 10, 100);
  EXPECT_DOUBLE_EQ(s.lr(0), 0.4);
  EXPECT_NEAR(s.lr(50), 0.2, 1e-12);
  EXPECT_NEAR(s.lr(100), 0.0, 1e-12);
  EXPECT_GT(s.lr(10), s.lr(11));
}

TEST(LrSchedule, WarmupRisesLinearlyThenHandsOver) {
  auto c = base();
  c.schedule = "constant";
  c.warmup_epochs = 0.5;  // 5 of 10 steps per epoch
  ptrain::train::LrSchedule s(ptrain::train::schedule_options(c), 10, 100);
  EXPECT_NEAR(s.lr(0), 0.4 * 1 / 5, 1e-12);
  EXPECT_NEAR(s.lr(4), 0.4, 1e-12);
  EXPECT_NEAR(s.lr(5), 0.4, 1e-12);
}

TEST(LrSchedule, WarmupInStepsAsDeepSpeedCountsIt) {
  auto c = base();
  c.schedule = "cosine";
  c.warmup_steps = 4;  // independent of the epoch length
  ptrain::train::LrSchedule s(ptrain::train::schedule_options(c), 1000, 104);
  EXPECT_NEAR(s.lr(0), 0.1, 1e-12);
  EXPECT_NEAR(s.lr(3), 0.4, 1e-12);
  EXPECT_NEAR(s.lr(54), 0.2, 1e-12);  // half-way through the 100 cosine steps
}

TEST(LrSchedule, StepDecaysAtMilestoneEpochs) {
  auto c = base();
  c.schedule = "step";
  c.milestones = {2, 4};
  c.gamma = 0.1;
  ptrain::train::LrSchedule s(ptrain::train::schedule_options(c), 10, 60);
  EXPECT_NEAR(s.lr(19), 0.4, 1e-12);
  EXPECT_NEAR(s.lr(20), 0.04, 1e-12);
  EXPECT_NEAR(s.lr(40), 0.004, 1e-12);
}

TEST(LrSchedule, RefusesWarmupLongerThanTheRun) {
  auto c = base();
  c.warmup_epochs = 20;
  EXPECT_THROW(ptrain::train::LrSchedule(ptrain::train::schedule_options(c), 10, 100), std::exception);
}

// A ds_config.json's scheduler, read as `ptrain train --deepspeed-config` reads it, against DeepSpeed's own
// formulas (tests/oracles/deepspeed_lr_schedules.py, driven as DeepSpeed's engine drives its scheduler): the rate
// of every optimizer step of a 60-step run, log and linear warm-up, for each of the three schedulers.
struct DeepSpeedCase {
  std::string type;
  std::string params_json;    // the file's scheduler.params
  std::string oracle_params;  // the same, as the oracle takes them
};

ptrain::config::TrainConfig read_ds_config(const std::string& json_text, std::vector<std::string>* warnings = nullptr) {
  ptrain::testing::TempDir dir;
  const std::string path = dir.file("ds_config.json");
  std::ofstream(path) << json_text;
  ptrain::config::TrainConfig config;
  CLI::App app;
  ptrain::config::add_train_options(app, config);
  const char* argv[] = {"train", "--device", "cpu"};
  app.parse(3, const_cast<char**>(argv));
  const auto said = ptrain::config::apply_deepspeed_config(app, config, path, 1);
  if (warnings) *warnings = said;
  return config;
}

std::string ds_config_with(const DeepSpeedCase& c) {
  return R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}, "scheduler": {"type": ")" + c.type +
         R"(", "params": )" + c.params_json + "}}";
}

TEST(LrSchedule, DeepSpeedsSchedulersGiveEveryStepDeepSpeedsRate) {
  constexpr int64_t kSteps = 60;
  const std::vector<DeepSpeedCase> cases = {
      {"WarmupLR", R"({"warmup_min_lr": 0.001, "warmup_max_lr": 0.05, "warmup_num_steps": 13})",
       "warmup_min_lr=0.001,warmup_max_lr=0.05,warmup_num_steps=13"},
      {"WarmupLR", R"({"warmup_min_lr": 0.001, "warmup_max_lr": 0.05, "warmup_num_steps": 13, "warmup_type": "linear"})",
       "warmup_min_lr=0.001,warmup_max_lr=0.05,warmup_num_steps=13,warmup_type=linear"},
      // No warmup_max_lr: the optimizer's lr; a warm-up of 1 is DeepSpeed's minimum of 2.
      {"WarmupLR", R"({"warmup_num_steps": 1})", "warmup_num_steps=1"},
      {"WarmupDecayLR", R"({"warmup_min_lr": 0.002, "warmup_max_lr": 0.05, "warmup_num_steps": 13, "total_num_steps": 60})",
       "warmup_min_lr=0.002,warmup_max_lr=0.05,warmup_num_steps=13,total_num_steps=60"},
      {"WarmupDecayLR", R"({"warmup_max_lr": 0.05, "warmup_num_steps": 13, "total_num_steps": 60, "warmup_type": "linear"})",
       "warmup_max_lr=0.05,warmup_num_steps=13,total_num_steps=60,warmup_type=linear"},
      {"WarmupCosineLR", R"({"warmup_min_ratio": 0.05, "warmup_num_steps": 13, "cos_min_ratio": 0.01, "total_num_steps": 60})",
       "warmup_min_ratio=0.05,warmup_num_steps=13,cos_min_ratio=0.01,total_num_steps=60"},
      {"WarmupCosineLR", R"({"warmup_num_steps": 13, "total_num_steps": 60, "warmup_type": "linear"})",
       "warmup_num_steps=13,total_num_steps=60,warmup_type=linear"},
  };
  // One oracle process for every case (each case's rates in turn, an empty line between two): starting Python
  // with torch costs more than the cases.
  std::string oracle_args = "--steps " + std::to_string(kSteps) + " --lr 0.1";
  for (const DeepSpeedCase& c : cases) oracle_args += " --case " + c.type + " " + c.oracle_params;
  const auto oracle = ptrain::testing::run_oracle("deepspeed_lr_schedules.py", oracle_args);
  ASSERT_EQ(oracle.exit_code, 0) << oracle.output;
  std::vector<std::vector<double>> rates_of_case(1);
  std::istringstream lines(oracle.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) {
      rates_of_case.emplace_back();
    } else {
      rates_of_case.back().push_back(std::stod(line));
    }
  }
  ASSERT_EQ(rates_of_case.size(), cases.size()) << oracle.output;
  for (size_t index = 0; index < cases.size(); ++index) {
    const DeepSpeedCase& c = cases[index];
    SCOPED_TRACE(c.type + " " + c.params_json);
    const std::vector<double>& expected = rates_of_case[index];
    ASSERT_EQ(static_cast<int64_t>(expected.size()), kSteps) << oracle.output;

    const auto config = read_ds_config(ds_config_with(c));
    EXPECT_EQ(config.optim.schedule, c.type);
    const int64_t total = config.run.max_steps > 0 ? config.run.max_steps : kSteps;
    EXPECT_EQ(total, kSteps);
    const ptrain::train::LrSchedule schedule(ptrain::train::schedule_options(config.optim), 10, total);
    for (int64_t step = 0; step < kSteps; ++step) {
      const double want = expected[static_cast<size_t>(step)];
      EXPECT_NEAR(schedule.lr(step), want, 1e-15 + 1e-12 * std::abs(want)) << "optimizer step " << step;
    }
  }
}

// A ds_config.json with each scheduler, as DeepSpeed's docs write them, runs as it is: read without an error,
// planned, and the plan's schedule built over the run.
TEST(LrSchedule, DsConfigsWithEachSchedulerArePlannedAsTheyAre) {
  for (const std::string scheduler :
       {R"({"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 10}})",
        R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 40, "warmup_min_lr": 0, "warmup_max_lr": 0.001,
            "warmup_num_steps": 10}})",
        R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 40, "warmup_num_steps": 10}})"}) {
    SCOPED_TRACE(scheduler);
    std::vector<std::string> warnings;
    const auto config = read_ds_config(
        R"({"train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
            "scheduler": )" + scheduler + "}",
        &warnings);
    EXPECT_NE(config.optim.schedule.find("Warmup"), std::string::npos);
    EXPECT_EQ(config.optim.warmup_type, "log");  // DeepSpeed's default, no longer refused
    EXPECT_EQ(config.optim.warmup_steps, 10);
    EXPECT_NO_THROW(ptrain::train::make_plan(config));
    const ptrain::train::LrSchedule schedule(ptrain::train::schedule_options(config.optim), 10, config.run.max_steps > 0 ? config.run.max_steps : 40);
    EXPECT_GT(schedule.lr(10), 0.0);
  }
}

TEST(LrSchedule, WarmupTypeAndFloorBelongToTheDeepSpeedSchedules) {
  auto c = base();
  c.schedule = "WarmupDecayLR";
  c.warmup_min_lr = 0.5;  // above lr 0.4
  EXPECT_THROW(ptrain::train::LrSchedule(ptrain::train::schedule_options(c), 10, 100), std::exception);
  c.warmup_min_lr = 0.1;
  c.warmup_type = "exponential";
  EXPECT_THROW(ptrain::train::LrSchedule(ptrain::train::schedule_options(c), 10, 100), std::exception);
}

}  // namespace
