// --profile-out on the CPU: the trace marks each traced step as torch.profiler's schedule does
// (ProfilerStep#N) and the optimizer's calls as PyTorch names them, each step's inside its step.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptrain/train/plan.h"
#include "ptrain/train/trainer.h"
#include "test_support.h"

namespace ptrain::train {
namespace {

struct Range {
  std::string name;
  double begin = 0, end = 0;
  bool inside(const Range& outer) const { return begin >= outer.begin && end <= outer.end; }
};

// Complete events ("ph": "X") of a Chrome trace, a bare array or an object with traceEvents.
std::vector<Range> ranges_of(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  const nlohmann::json trace = nlohmann::json::parse(in);
  const nlohmann::json& events = trace.is_array() ? trace : trace.at("traceEvents");
  std::vector<Range> ranges;
  for (const auto& e : events) {
    if (e.value("ph", "") != "X") continue;
    const double begin = e.at("ts").get<double>();
    ranges.push_back({e.at("name").get<std::string>(), begin, begin + e.value("dur", 0.0)});
  }
  return ranges;
}

std::vector<Range> named(const std::vector<Range>& ranges, const std::string& prefix) {
  std::vector<Range> found;
  for (const auto& r : ranges) {
    if (r.name.rfind(prefix, 0) == 0) found.push_back(r);
  }
  std::sort(found.begin(), found.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  return found;
}

// A resnet20 run on synthetic CPU data with --profile-out and --profile-steps.
config::TrainConfig profiled_run(const ptrain::testing::TempDir& dir, const std::string& samples, int64_t max_steps,
                                 const std::string& profile_steps) {
  config::TrainConfig c;
  c.model.name = "resnet20";
  c.data.dataset = "synthetic";
  c.data.path = samples + ":1x8x8:4";
  c.data.test_limit = 8;
  c.run.batch_size = 8;
  c.run.device = "cpu";
  c.run.threads = 1;
  c.run.max_steps = max_steps;
  c.run.progress = "none";
  c.run.eval_each_epoch = false;
  c.run.profile_out = dir.file("trace.json");
  c.run.profile_steps = profile_steps;
  return c;
}

TEST(ProfileTrace, MarksEachTracedStepAndTheOptimizersCallsInsideIt) {
  ptrain::testing::TempDir dir;
  const config::TrainConfig c = profiled_run(dir, "64", 5, "2:4");
  train(make_plan(c), "profile_trace_test");

  const auto ranges = ranges_of(c.run.profile_out);
  const auto steps = named(ranges, "ProfilerStep#");
  ASSERT_EQ(steps.size(), 3u) << "one range a traced step";
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].name, "ProfilerStep#" + std::to_string(2 + i)) << "the global step, in order";
    if (i > 0) { EXPECT_GE(steps[i].begin, steps[i - 1].end) << "steps follow one another"; }
  }
  for (const auto& [call, expected] : std::map<std::string, std::string>{
           {"Optimizer.step#", "Optimizer.step#SGD.step"}, {"Optimizer.zero_grad#", "Optimizer.zero_grad#SGD.zero_grad"}}) {
    const auto calls = named(ranges, call);
    ASSERT_EQ(calls.size(), steps.size()) << call;
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i].name, expected);
      EXPECT_TRUE(calls[i].inside(steps[i])) << calls[i].name << " of step " << 2 + i << " outside its ProfilerStep";
    }
  }
  // The operators still come with the ranges: the first step's convolutions lie inside it.
  const auto convolutions = named(ranges, "aten::conv");
  ASSERT_FALSE(convolutions.empty());
  EXPECT_TRUE(std::any_of(convolutions.begin(), convolutions.end(), [&](const Range& r) { return r.inside(steps[0]); }));
}

TEST(ProfileTrace, AdamWStepsAreNamedAsPyTorchNamesThem) {
  ptrain::testing::TempDir dir;
  config::TrainConfig c = profiled_run(dir, "32", 2, "1:1");
  c.optim.name = "adamw";
  train(make_plan(c), "profile_trace_test");

  const auto ranges = ranges_of(c.run.profile_out);
  ASSERT_EQ(named(ranges, "ProfilerStep#").size(), 1u);
  EXPECT_EQ(named(ranges, "ProfilerStep#").front().name, "ProfilerStep#1");
  ASSERT_EQ(named(ranges, "Optimizer.step#").size(), 1u);
  EXPECT_EQ(named(ranges, "Optimizer.step#").front().name, "Optimizer.step#AdamW.step");
}

}  // namespace
}  // namespace ptrain::train
