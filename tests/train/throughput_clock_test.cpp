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

// Marks split the steady time into stretches, each its seconds over its steps; a mark again at the same step
// adds nothing, and the time between epochs (an evaluation) belongs to no stretch.
TEST(ThroughputClock, MarksGiveSecondsAStepPerStretchAndLeaveEvaluationOut) {
  ThroughputClock clock;
  clock.plan_steady(0, 32);
  const auto epoch = ThroughputClock::Clock::now();
  clock.begin_epoch(0);
  clock.mark(4);  // before the steady clock: nothing
  clock.start_steady();  // after step 8
  clock.mark(8);
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  clock.mark(10);  // two steps in 40 ms
  clock.mark(10);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  clock.add_epoch(epoch, 1.0, 0, 16, 256);  // six steps in 30 ms
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // an evaluation
  const auto second = ThroughputClock::Clock::now();
  clock.begin_epoch(16);
  std::this_thread::sleep_for(std::chrono::milliseconds(16));
  clock.add_epoch(second, 1.0, 16, 32, 256);  // sixteen steps in 16 ms

  const auto& seconds = clock.steady_step_seconds();
  ASSERT_EQ(seconds.size(), 3u);
  EXPECT_GE(seconds[0], 0.020);
  EXPECT_LT(seconds[0], 0.020 + 0.1);
  EXPECT_GE(seconds[1], 0.005);
  EXPECT_LT(seconds[1], 0.005 + 0.1 / 6);
  EXPECT_GE(seconds[2], 0.001);
  EXPECT_LT(seconds[2], 0.01) << "the 200 ms between the epochs is no step's";
}

}  // namespace
}  // namespace ptrain::train
