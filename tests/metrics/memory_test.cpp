#include "ptrain/metrics/memory.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include <torch/torch.h>

#include "ptrain/core/error.h"
#include "ptrain/metrics/cpu_allocator.h"

using namespace ptrain::metrics;

TEST(HostMemory, RssGrowsAfterTouching200MB) {
  constexpr int64_t kBytes = 200ll << 20;
  const int64_t before = host_rss_bytes();
  EXPECT_GT(before, 0);
  auto* block = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, kBytes);  // pages count as resident only once written
  // Without this barrier GCC elides the malloc/memset/free of a block nobody reads.
  asm volatile("" : : "r"(block) : "memory");
  const int64_t during = host_rss_bytes();
  const int64_t peak_during = host_peak_rss_bytes();
  std::free(block);

  EXPECT_GE(during - before, kBytes * 95 / 100) << "before " << before << " during " << during;
  // VmHWM is a high-water mark: it includes the block, and stays after the block is returned. (Not
  // compared with VmRSS to the byte: gVisor, for one, updates the two at different times.)
  EXPECT_GE(peak_during - before, kBytes * 95 / 100);
  EXPECT_GE(host_peak_rss_bytes() - before, kBytes * 95 / 100);
}

TEST(CudaAllocator, CpuBuildReportsNothing) {
#if PTRAIN_WITH_CUDA
  GTEST_SKIP() << "CUDA build: covered by PeaksFollowAllocations";
#else
  const auto peak = cuda_allocator_peak(0);
  EXPECT_FALSE(peak.allocated_bytes);
  EXPECT_FALSE(peak.reserved_bytes);
  reset_cuda_allocator_peak(0);
  EXPECT_THROW(cuda_device_pci_bus_id(0), ptrain::Error);
#endif
}

#if PTRAIN_WITH_CUDA
TEST(CudaAllocator, PeaksFollowAllocations) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kBytes = 64ll << 20;
  reset_cuda_allocator_peak(0);
  {
    auto t = torch::empty({kBytes / 4}, torch::TensorOptions().dtype(torch::kFloat).device(torch::kCUDA, 0));
    const auto peak = cuda_allocator_peak(0);
    ASSERT_TRUE(peak.allocated_bytes && peak.reserved_bytes);
    EXPECT_GE(*peak.allocated_bytes, kBytes);
    EXPECT_GE(*peak.reserved_bytes, *peak.allocated_bytes);
  }
  EXPECT_GE(*cuda_allocator_peak(0).allocated_bytes, kBytes);  // a peak outlives the tensor
  const std::string bus_id = cuda_device_pci_bus_id(0);
  EXPECT_EQ(bus_id.size(), 12u) << bus_id;  // dddd:bb:dd.f
  EXPECT_EQ(bus_id[4], ':');
}
#endif

TEST(CpuAllocator, CountsTensorBytesAndKeepsThePeak) {
  install_cpu_allocation_counter();
  install_cpu_allocation_counter();  // idempotent
  reset_cpu_allocator_peak();
  const int64_t before = cpu_allocated_bytes();
  constexpr int64_t kFloats = 4 << 20;  // 16 MiB
  {
    auto a = torch::ones({kFloats});
    EXPECT_GE(cpu_allocated_bytes() - before, kFloats * 4);
    auto b = a * 2;  // a second 16 MiB
    EXPECT_GE(cpu_allocated_bytes() - before, 2 * kFloats * 4);
    EXPECT_EQ(b[7].item<float>(), 2.0f);
  }
  // Both freed: what is held returns to where it was, the peak stays at both.
  EXPECT_LT(cpu_allocated_bytes() - before, kFloats);
  EXPECT_GE(cpu_peak_allocated_bytes() - before, 2 * kFloats * 4);
  reset_cpu_allocator_peak();
  EXPECT_EQ(cpu_peak_allocated_bytes(), cpu_allocated_bytes());
}
