#include "ptrain/metrics/timer.h"

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

#if PTRAIN_WITH_CUDA
TEST(CudaEventTimer, TimesDeviceWork) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto a = torch::randn({2048, 2048}, torch::kCUDA);
  ptrain::metrics::CudaEventTimer timer;
  timer.start();
  for (int i = 0; i < 10; ++i) (void)torch::mm(a, a);
  timer.stop();
  const double seconds = timer.elapsed_seconds();
  EXPECT_GT(seconds, 0.0);
  EXPECT_LT(seconds, 10.0);
}
#endif
