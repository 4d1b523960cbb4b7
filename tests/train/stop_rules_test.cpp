// The run's stop rules in-process, without a run: --on-divergence decided in one place, --stop-at-step's pause
// and its checks, and a stop signal taken at the step boundary it arrives at.
#include <gtest/gtest.h>

#include <csignal>

#include "ptrain/core/error.h"
#include "ptrain/train/run/stop_rules.h"

namespace {

using ptrain::train::OnDivergence;
using ptrain::train::StopRules;

StopRules rules(StopRules::Options options) {
  return StopRules(std::move(options), torch::kCPU, 1, [](torch::Tensor&) {});
}

TEST(StopRules, StopOnDivergenceThrowsAndMarksTheRunAsStoppingOnIt) {
  StopRules stop = rules({OnDivergence::kStop, 0, {}, false});
  try {
    stop.diverged("training diverged at step 7", 7);
    FAIL() << "no error";
  } catch (const ptrain::Error& e) {
    EXPECT_STREQ(e.what(),
                 "training diverged at step 7; stopped before saving anything from then on. Try a lower --lr or "
                 "--clip-grad-norm, or --on-divergence warn to train on");
  }
  EXPECT_TRUE(stop.stopping_on_divergence());
  EXPECT_EQ(stop.diverged_at_step(), 7);
}

TEST(StopRules, WarnOnDivergenceTrainsOnKeepingTheFirstDivergedStep) {
  StopRules warn = rules({OnDivergence::kWarn, 0, {}, false});
  EXPECT_FALSE(warn.diverged_at_step());
  warn.diverged("diverged", 4);
  warn.diverged("diverged", 9);
  warn.state_not_finite("not finite", 12);
  EXPECT_EQ(warn.diverged_at_step(), 4);
  EXPECT_FALSE(warn.stopping_on_divergence());
}

TEST(StopRules, AStateThatIsNotFiniteStopsTheRunUnderStop) {
  StopRules stop = rules({OnDivergence::kStop, 0, {}, false});
  EXPECT_THROW(stop.state_not_finite("no checkpoint saved", 3), ptrain::Error);
  EXPECT_EQ(stop.diverged_at_step(), 3);
  EXPECT_TRUE(stop.stopping_on_divergence());
}

TEST(StopRules, PausesAtStopAtStepButNeverAtTheRunsLastStep) {
  StopRules pause = rules({OnDivergence::kStop, 5, {}, false});
  EXPECT_FALSE(pause.stop_after(4, 10, false));
  EXPECT_TRUE(pause.stop_after(5, 10, false));
  EXPECT_TRUE(pause.paused());
  EXPECT_EQ(pause.signal(), 0);
  StopRules at_end = rules({OnDivergence::kStop, 10, {}, false});
  EXPECT_FALSE(at_end.stop_after(10, 10, true));
}

TEST(StopRules, RefusesAPausePointOutsideTheRun) {
  StopRules pause = rules({OnDivergence::kStop, 5, {}, false});
  EXPECT_NO_THROW(pause.check_pause_point(0, 10, "--max-steps 10", ""));
  EXPECT_THROW(pause.check_pause_point(0, 5, "--max-steps 5", ""), ptrain::Error);
  EXPECT_THROW(pause.check_pause_point(5, 10, "--max-steps 10", "ck/step-00000005.safetensors"), ptrain::Error);
  EXPECT_NO_THROW(rules({}).check_pause_point(3, 3, "--max-steps 3", ""));
}

TEST(StopRules, OneProcessStopsAtTheStepItsSignalArrivesAfter) {
  int pending = 0;
  StopRules signals = rules({OnDivergence::kStop, 0, [&] { return pending; }, false});
  EXPECT_FALSE(signals.stop_after(1, 10, false));
  pending = SIGTERM;
  EXPECT_TRUE(signals.stop_after(2, 10, false));
  EXPECT_EQ(signals.signal(), SIGTERM);
  EXPECT_FALSE(signals.paused());
}

}  // namespace
