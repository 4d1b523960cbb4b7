#include "ptrain/metrics/gpu_sampler.h"

#include <gtest/gtest.h>

#include "ptrain/core/error.h"

using namespace std::chrono_literals;
using ptrain::metrics::GpuSampler;
using ptrain::metrics::Nvml;

TEST(GpuSampler, WithoutNvmlReportsNothing) {
  Nvml missing("/nonexistent/libnvidia-ml.so.1");
  GpuSampler sampler({0}, 5ms, missing);
  sampler.start();
  std::this_thread::sleep_for(30ms);
  sampler.stop();
  const auto s = sampler.stats();
  EXPECT_EQ(s.samples, 0);
  EXPECT_FALSE(s.util_mean);
  EXPECT_FALSE(s.util_peak);
  EXPECT_FALSE(s.memory_used_peak);
}

TEST(GpuSampler, UnknownDeviceIndexGivesNoSamples) {
  Nvml fake(PTRAIN_FAKE_NVML);
  GpuSampler sampler({7}, 5ms, fake);
  sampler.start();
  std::this_thread::sleep_for(30ms);
  sampler.stop();
  EXPECT_EQ(sampler.stats().samples, 0);
  EXPECT_FALSE(sampler.stats().util_mean);
}

TEST(GpuSampler, AveragesOverDevicesAndKeepsPeaks) {
  Nvml fake(PTRAIN_FAKE_NVML);
  GpuSampler sampler({0, 1}, 2ms, fake);
  sampler.start();
  std::this_thread::sleep_for(60ms);
  sampler.stop();
  const auto s = sampler.stats();
  ASSERT_GE(s.samples, 2);
  // The fake reports 40 % and 80 %: every sample's device mean is 60.
  EXPECT_EQ(s.util_mean, 60.0);
  EXPECT_EQ(s.util_peak, 80.0);
  // Device 1 starts at 2 GiB and grows 1 MiB per query; the last of its samples-many queries is the peak.
  ASSERT_TRUE(s.memory_used_peak);
  EXPECT_EQ(*s.memory_used_peak, (2ull << 30) + static_cast<uint64_t>(s.samples - 1) * (1ull << 20));

  // Stopped means stopped: no samples are added afterwards.
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(sampler.stats().samples, s.samples);
}

TEST(GpuSampler, StartTwiceIsRefusedAndStopIsIdempotent) {
  Nvml fake(PTRAIN_FAKE_NVML);
  GpuSampler sampler({0}, 5ms, fake);
  sampler.start();
  EXPECT_THROW(sampler.start(), ptrain::Error);
  sampler.stop();
  sampler.stop();
  EXPECT_GE(sampler.stats().samples, 1);  // one sample is taken at start
}

TEST(GpuSampler, NonPositivePeriodIsRefused) {
  Nvml fake(PTRAIN_FAKE_NVML);
  EXPECT_THROW(GpuSampler({0}, 0ms, fake), ptrain::Error);
}
