#include <gtest/gtest.h>

#include <cmath>

#include "ptrain/train/schedule.h"

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
  ptrain::train::LrSchedule s(c, 10, 100);
  EXPECT_DOUBLE_EQ(s.lr(0), 0.4);
  EXPECT_NEAR(s.lr(50), 0.2, 1e-12);
  EXPECT_NEAR(s.lr(100), 0.0, 1e-12);
  EXPECT_GT(s.lr(10), s.lr(11));
}

TEST(LrSchedule, WarmupRisesLinearlyThenHandsOver) {
  auto c = base();
  c.schedule = "constant";
  c.warmup_epochs = 0.5;  // 5 of 10 steps per epoch
  ptrain::train::LrSchedule s(c, 10, 100);
  EXPECT_NEAR(s.lr(0), 0.4 * 1 / 5, 1e-12);
  EXPECT_NEAR(s.lr(4), 0.4, 1e-12);
  EXPECT_NEAR(s.lr(5), 0.4, 1e-12);
}

TEST(LrSchedule, WarmupInStepsAsDeepSpeedCountsIt) {
  auto c = base();
  c.schedule = "cosine";
  c.warmup_steps = 4;  // independent of the epoch length
  ptrain::train::LrSchedule s(c, 1000, 104);
  EXPECT_NEAR(s.lr(0), 0.1, 1e-12);
  EXPECT_NEAR(s.lr(3), 0.4, 1e-12);
  EXPECT_NEAR(s.lr(54), 0.2, 1e-12);  // half-way through the 100 cosine steps
}

TEST(LrSchedule, StepDecaysAtMilestoneEpochs) {
  auto c = base();
  c.schedule = "step";
  c.milestones = {2, 4};
  c.gamma = 0.1;
  ptrain::train::LrSchedule s(c, 10, 60);
  EXPECT_NEAR(s.lr(19), 0.4, 1e-12);
  EXPECT_NEAR(s.lr(20), 0.04, 1e-12);
  EXPECT_NEAR(s.lr(40), 0.004, 1e-12);
}

TEST(LrSchedule, RefusesWarmupLongerThanTheRun) {
  auto c = base();
  c.warmup_epochs = 20;
  EXPECT_THROW(ptrain::train::LrSchedule(c, 10, 100), std::exception);
}

}  // namespace
