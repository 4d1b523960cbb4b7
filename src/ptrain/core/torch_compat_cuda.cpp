// The compatibility layer's CUDA-build half: Kineto's profiler (PyTorch's wheel has it: CPU operators and
// CUDA kernels on one timeline), the CUDA caching allocator's statistics and CUDA graph capture.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#if __has_include(<torch/csrc/cuda/nccl.h>)
#include <torch/csrc/cuda/nccl.h>
#define PTRAIN_HAVE_LOCAL_NCCL 1
#else
#define PTRAIN_HAVE_LOCAL_NCCL 0
#endif

#include "ptrain/core/profiler_session.h"
#include "ptrain/core/torch_compat.h"

namespace ptrain::compat {

namespace profiler_session {

void start(bool with_cuda) {
  namespace profiler = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (with_cuda) activities.insert(ActivityType::CUDA);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
}

void stop_into(const std::string& file) { torch::autograd::profiler::disableProfiler()->save(file); }

}  // namespace profiler_session

CudaAllocatorPeaks cuda_allocator_peaks(int device) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
#if PTRAIN_TORCH_AT_LEAST(2, 6)
  constexpr auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
#else
  constexpr auto aggregate = static_cast<size_t>(c10::cuda::CUDACachingAllocator::StatType::AGGREGATE);
#endif
  return {stats.allocated_bytes[aggregate].peak, stats.reserved_bytes[aggregate].peak};
}

void reset_cuda_allocator_peaks(int device) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
}

bool nccl_broadcast_from_first(std::vector<torch::Tensor>& buffers) {
#if PTRAIN_HAVE_LOCAL_NCCL
  torch::cuda::nccl::broadcast(buffers);
  return true;
#else
  (void)buffers;
  return false;
#endif
}

bool nccl_reduce_into_first(std::vector<torch::Tensor>& buffers) {
#if PTRAIN_HAVE_LOCAL_NCCL
  torch::cuda::nccl::reduce(buffers, buffers.front(), /*root=*/0);
  return true;
#else
  (void)buffers;
  return false;
#endif
}

void begin_thread_local_capture(at::cuda::CUDAGraph& graph) {
#if PTRAIN_TORCH_AT_LEAST(2, 1)
  graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
#else
  (void)graph;
  TORCH_CHECK(false, "CUDA graph capture needs LibTorch 2.1 or later (thread-local capture mode)");
#endif
}

}  // namespace ptrain::compat
