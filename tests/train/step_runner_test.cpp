// The step runner's life with a graph, on a stand-in for the CUDA mechanism that records what it is asked to do:
// eager steps on the capture stream first, one capture (whose step runs by a replay), replays fed through the
// static inputs, and, after the last step, the graph released once and no step run after it.
#include <gtest/gtest.h>

#include "ptrain/core/error.h"
#include "ptrain/train/step_runner.h"

namespace ptrain::train {
namespace {

struct Calls {
  int on_capture_stream = 0, captures = 0, replays = 0, releases = 0;
};

class RecordingGraph final : public CapturedStep {
 public:
  explicit RecordingGraph(Calls& calls) : calls_(calls) {}
  void run_on_capture_stream(const std::function<void()>& fn) override {
    ++calls_.on_capture_stream;
    fn();
  }
  void capture(const std::function<void()>& fn) override {
    ++calls_.captures;
    recorded_ = fn;
  }
  void replay() override {
    check(recorded_ != nullptr, "replay before capture");
    ++calls_.replays;
    recorded_();
  }
  void release() override {
    ++calls_.releases;
    recorded_ = nullptr;
  }

 private:
  Calls& calls_;
  std::function<void()> recorded_;
};

TEST(StepRunner, RunsEagerlyThenCapturesReplaysAndReleasesTheGraphOnce) {
  Calls calls;
  metrics::StepPhaseTimer phases(torch::kCPU);
  std::vector<float> seen;  // the first image of every batch the step read
  StepRunner runner(std::make_unique<RecordingGraph>(calls), phases,
                    [&](const StepRunner::Batches& images, const StepRunner::Batches&) {
                      seen.push_back(images[0][0].item<float>());
                    });
  const auto batch = [](float value) { return StepRunner::Batches{torch::full({2}, value)}; };
  for (int step = 0; step < 6; ++step) runner.run(batch(static_cast<float>(step)), {torch::zeros({2})});
  EXPECT_EQ(calls.on_capture_stream, StepRunner::kEagerStepsBeforeCapture);
  EXPECT_EQ(calls.captures, 1);
  EXPECT_EQ(calls.replays, 6 - StepRunner::kEagerStepsBeforeCapture);  // the capture's own step runs by a replay
  EXPECT_TRUE(runner.captured());
  // Every step read its own batch, the replays through the static inputs the capture recorded.
  EXPECT_EQ(seen, (std::vector<float>{0, 1, 2, 3, 4, 5}));

  runner.release_graph();
  EXPECT_EQ(calls.releases, 1);
  EXPECT_TRUE(runner.captured()) << "the record still says the run's steps were captured";
  EXPECT_THROW(runner.run(batch(6), {torch::zeros({2})}), Error);
  EXPECT_EQ(calls.replays, 3);
}

TEST(StepRunner, WithoutAGraphReleaseIsHarmless) {
  metrics::StepPhaseTimer phases(torch::kCPU);
  int steps = 0;
  StepRunner runner(nullptr, phases, [&](const StepRunner::Batches&, const StepRunner::Batches&) { ++steps; });
  runner.run({torch::zeros({1})}, {torch::zeros({1})});
  EXPECT_FALSE(runner.captured());
  runner.release_graph();
  EXPECT_EQ(steps, 1);
  EXPECT_THROW(runner.run({torch::zeros({1})}, {torch::zeros({1})}), Error);
}

}  // namespace
}  // namespace ptrain::train
