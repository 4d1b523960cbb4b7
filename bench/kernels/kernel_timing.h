// What the kernel benchmarks of this folder share: CUDA's status checked, a launcher's time as the median of repeated
// runs, each after a write that evicts the L2 cache, and the memory's peak bandwidth read off the device.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace ptrain::bench {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

class KernelTimer {
 public:
  // warm: no flush (as when the previous kernel just wrote the tensors); otherwise each run follows a write of 256
  // MiB that evicts the L2 cache (as when they were written long before).
  KernelTimer(cudaStream_t stream, int reps, bool warm) : stream_(stream), reps_(reps), warm_(warm) {
    check(cudaMalloc(&flush_, kFlushBytes), "cudaMalloc");
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  KernelTimer(const KernelTimer&) = delete;
  KernelTimer& operator=(const KernelTimer&) = delete;

  // Evicts the L2 cache, writing value, unless warm.
  void flush_l2(int value) {
    if (!warm_) check(cudaMemsetAsync(flush_, value, kFlushBytes, stream_), "flush");
  }

  // Median time in µs of fn over reps runs after a first untimed one (module load, caches).
  template <typename Fn>
  double median_us(Fn&& fn) {
    std::vector<float> ms(static_cast<size_t>(reps_));
    fn();
    for (int r = 0; r < reps_; ++r) {
      flush_l2(r & 0xff);
      check(cudaEventRecord(start_, stream_), "cudaEventRecord");
      fn();
      check(cudaEventRecord(stop_, stream_), "cudaEventRecord");
      check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
      check(cudaEventElapsedTime(&ms[static_cast<size_t>(r)], start_, stop_), "cudaEventElapsedTime");
    }
    std::nth_element(ms.begin(), ms.begin() + reps_ / 2, ms.end());
    return 1000.0 * ms[static_cast<size_t>(reps_ / 2)];
  }

 private:
  static constexpr size_t kFlushBytes = size_t(256) << 20;
  cudaStream_t stream_;
  int reps_;
  bool warm_;
  void* flush_ = nullptr;
  cudaEvent_t start_, stop_;
};

struct MemoryPeak {
  double tbps = 0.0;
  int clock_khz = 0, bus_bits = 0;
};

// The memory's peak from the device itself: two transfers a clock (double data rate) over the bus. Zero, with a
// warning naming program, where the device does not report its memory clock.
inline MemoryPeak memory_peak(int device, const char* program) {
  MemoryPeak peak;
  if (cudaDeviceGetAttribute(&peak.clock_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&peak.bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
    (void)cudaGetLastError();
    std::fprintf(stderr, "%s: the device does not report its memory clock: no peak to compare with\n", program);
    return {};
  }
  peak.tbps = 2.0 * peak.clock_khz * 1e3 * (peak.bus_bits / 8.0) / 1e12;
  return peak;
}

}  // namespace ptrain::bench
