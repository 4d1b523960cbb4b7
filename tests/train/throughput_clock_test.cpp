// The run's throughput clock: which steps the steady rate leaves out, and what it and the whole-run
// figures add up over epochs (a resumed run counts only the steps it trains).
#include <gtest/gtest.h>

#include <thread>

#include "ptrain/train/throughput_clock.h"

namespace ptrain::train {
namespace {

TEST(ThroughputClock, SteadyRateLeavesOutTenStepsOrAQuarterOfAShortRunAndNoneOfAVeryShortOne) {
  const auto first_steady_after = [](int64_t first, int64_t last) {
    ThroughputClock clock;
    clock.plan_steady(first, last);
    return clock.steady_from_step();
  };
  EXPECT_EQ(first_steady_after(0, 100), 10);
  EXPECT_EQ(first_steady_after(0, 32), 8);
  EXPECT_EQ(first_steady_after(0, 8), 2);
  EXPECT_EQ(first_steady_after(0, 7), -1);
  EXPECT_EQ(first_steady_after(40, 100), 50) << "a resumed run counts from where it resumed";
}

TEST(ThroughputClock, EpochsAddUpAndTheSteadyPartStartsAfterItsStep) {
  ThroughputClock clock;
  clock.plan_steady(0, 32);
  EXPECT_FALSE(clock.steady_starts_after(7));
  ASSERT_TRUE(clock.steady_starts_after(8));

  const auto first_epoch = ThroughputClock::Clock::now();
  clock.start_steady();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  clock.add_epoch(first_epoch, 1.5, 0, 16, 256);
  const auto second_epoch = ThroughputClock::Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  clock.add_epoch(second_epoch, 0.5, 16, 32, 256);

  EXPECT_DOUBLE_EQ(clock.train_seconds(), 2.0);
  EXPECT_EQ(clock.images(), 512);
  EXPECT_EQ(clock.steady_steps(), 24) << "steps 9-32";
  EXPECT_GE(clock.steady_seconds(), 0.04);
  EXPECT_LT(clock.steady_seconds(), 1.0);
}

TEST(ThroughputClock, NoSteadyFigureUntilItsClockStarts) {
  ThroughputClock clock;
  clock.plan_steady(0, 32);
  clock.add_epoch(ThroughputClock::Clock::now(), 1.0, 0, 16, 256);
  EXPECT_EQ(clock.steady_steps(), 0);
  EXPECT_EQ(clock.steady_seconds(), 0);
}

}  // namespace
}  // namespace ptrain::train
