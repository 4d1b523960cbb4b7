// Dense peaks by device and precision (the datasheets' figures, or multiprocessors x clock x the architecture's
// rate) and the utilisation arithmetic, with the properties a device would report.
#include "ptrain/metrics/flops.h"

#include <gtest/gtest.h>

namespace {

using ptrain::cuda_runtime::DeviceProperties;
using ptrain::metrics::dense_peak;
using ptrain::metrics::MathRate;

DeviceProperties gpu(const std::string& name, int multiprocessors, int clock_mhz, int capability) {
  return {name, multiprocessors, clock_mhz * 1000, capability};
}

TEST(DensePeak, HopperBoardsTakeTheirDatasheets) {
  const auto sxm = gpu("NVIDIA H100 80GB HBM3", 132, 1980, 90);
  EXPECT_DOUBLE_EQ(dense_peak(sxm, MathRate::kHalf)->flops_per_second, 989.4e12);
  EXPECT_DOUBLE_EQ(dense_peak(sxm, MathRate::kTf32)->flops_per_second, 494.7e12);
  EXPECT_DOUBLE_EQ(dense_peak(sxm, MathRate::kFp8)->flops_per_second, 1978.9e12);
  EXPECT_DOUBLE_EQ(dense_peak(sxm, MathRate::kFp32)->flops_per_second, 66.9e12);
  EXPECT_EQ(dense_peak(sxm, MathRate::kHalf)->basis, "H100 SXM5 datasheet, dense bf16/fp16");
  // The PCIe and NVL boards extend the SXM board's name and have lower peaks.
  EXPECT_DOUBLE_EQ(dense_peak(gpu("NVIDIA H100 PCIe", 114, 1755, 90), MathRate::kHalf)->flops_per_second, 756e12);
  EXPECT_DOUBLE_EQ(dense_peak(gpu("NVIDIA H100 NVL", 132, 1785, 90), MathRate::kHalf)->flops_per_second, 835.5e12);
  EXPECT_DOUBLE_EQ(dense_peak(gpu("NVIDIA H200", 132, 1980, 90), MathRate::kHalf)->flops_per_second, 989.4e12);
  EXPECT_DOUBLE_EQ(dense_peak(gpu("NVIDIA H200 NVL", 132, 1785, 90), MathRate::kFp8)->flops_per_second, 1670.5e12);
}

TEST(DensePeak, NamesMatchWholeWordsAndMissingRatesAreNull) {
  EXPECT_DOUBLE_EQ(dense_peak(gpu("NVIDIA L40S", 142, 2520, 89), MathRate::kHalf)->flops_per_second, 362.05e12);
  EXPECT_DOUBLE_EQ(dense_peak(gpu("NVIDIA L4", 58, 2040, 89), MathRate::kHalf)->flops_per_second, 121e12);
  EXPECT_DOUBLE_EQ(dense_peak(gpu("NVIDIA A100-SXM4-80GB", 108, 1410, 80), MathRate::kTf32)->flops_per_second, 156e12);
  EXPECT_FALSE(dense_peak(gpu("NVIDIA A100-SXM4-80GB", 108, 1410, 80), MathRate::kFp8)) << "an A100 has no FP8";
}

// A GPU with no datasheet row: its multiprocessors x clock x the architecture's dense rate (an A10's 125 TFLOP/s
// bf16 are 72 x 1695 MHz x 1024); none for architectures ptrain has no rate for.
TEST(DensePeak, OtherGpusAreDerivedFromTheirClocks) {
  const auto a10 = dense_peak(gpu("NVIDIA A10", 72, 1695, 86), MathRate::kHalf);
  ASSERT_TRUE(a10);
  EXPECT_DOUBLE_EQ(a10->flops_per_second, 72 * 1695e6 * 1024);
  EXPECT_EQ(a10->basis, "derived: 72 SMs x 1695 MHz x 1024 FLOP a clock (compute capability 8.6), dense bf16/fp16");
  EXPECT_FALSE(dense_peak(gpu("NVIDIA A10", 72, 1695, 86), MathRate::kFp8));
  EXPECT_FALSE(dense_peak(gpu("Tesla T4", 40, 1590, 75), MathRate::kHalf)) << "no rate for compute capability 7.5";
  EXPECT_FALSE(dense_peak(gpu("NVIDIA A10", 72, 0, 86), MathRate::kHalf)) << "no clock read, no derived peak";
}

// 8.18 GFLOPs a ResNet-50 image forward, a step of 256 images at 2,000 images/s over 2 devices of 989.4 TFLOP/s.
TEST(FlopUtilisation, ThreeForwardsPerSampleOverThePeak) {
  const ptrain::metrics::DensePeak peak{989.4e12, "test"};
  const auto u = ptrain::metrics::flop_utilisation(8.18e9, 256, 2000.0, 2, peak);
  EXPECT_DOUBLE_EQ(u.model_flops_per_step, 3 * 8.18e9 * 256);
  EXPECT_DOUBLE_EQ(u.tflops, 3 * 8.18e9 * 1000.0 / 1e12);
  ASSERT_TRUE(u.mfu);
  EXPECT_DOUBLE_EQ(*u.mfu, 3 * 8.18e9 * 1000.0 / 989.4e12);
  EXPECT_FALSE(ptrain::metrics::flop_utilisation(8.18e9, 256, 2000.0, 2, std::nullopt).mfu);
}

}  // namespace
