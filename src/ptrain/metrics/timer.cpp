#include "ptrain/metrics/timer.h"

#include <torch/cuda.h>

namespace ptrain::metrics {

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
}

#if PTRAIN_WITH_CUDA
// cudaEventDefault (0) keeps timing enabled; ATen's default flags disable it.
CudaEventTimer::CudaEventTimer() : start_(0), stop_(0) {}

void CudaEventTimer::start() { start_.record(); }

void CudaEventTimer::stop() { stop_.record(); }

double CudaEventTimer::elapsed_seconds() {
  stop_.synchronize();
  return static_cast<double>(start_.elapsed_time(stop_)) / 1000.0;
}
#endif

}  // namespace ptrain::metrics
