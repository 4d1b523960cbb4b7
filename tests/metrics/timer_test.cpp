#include "ptrain/metrics/timer.h"
#include "ptrain/metrics/step_phases.h"

#include <gtest/gtest.h>

#include <thread>

using namespace std::chrono_literals;
using ptrain::metrics::Stopwatch;

TEST(Stopwatch, MeasuresASleepAndRestarts) {
  Stopwatch watch;
  std::this_thread::sleep_for(50ms);
  const double first = watch.elapsed_seconds_after_sync(torch::kCPU);
  EXPECT_GE(first, 0.05);
  EXPECT_LT(first, 2.0);
  watch.restart();
  EXPECT_LT(watch.elapsed_seconds(), first);
}

// The device clock: CUDA events on CUDA devices (CUDA builds), nothing elsewhere (the host times).
TEST(DeviceInterval, NoneForTheCpu) { EXPECT_EQ(ptrain::metrics::make_device_interval(torch::kCPU), nullptr); }

TEST(DeviceInterval, TimesDeviceWork) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto a = torch::randn({2048, 2048}, torch::kCUDA);
  auto interval = ptrain::metrics::make_device_interval(a.device());
  ASSERT_NE(interval, nullptr);
  interval->begin();
  for (int i = 0; i < 10; ++i) (void)torch::mm(a, a);
  interval->end();
  const double seconds = interval->seconds();
  EXPECT_GT(seconds, 0.0);
  EXPECT_LT(seconds, 10.0);
}
