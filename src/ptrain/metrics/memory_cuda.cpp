// CUDA builds: the device half of memory.h, on the caching allocator and the CUDA runtime.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <torch/torch.h>

#include "ptrain/core/torch_compat.h"
#include "ptrain/metrics/memory.h"

namespace ptrain::metrics {
namespace {

// The caching allocator learns the device count on CUDA's lazy initialisation, and refuses queries
// for devices before it ("Invalid device argument"). Creating an empty tensor initialises CUDA the
// same way in every release, unlike the Context method, renamed in 2.x.
void ensure_cuda_initialised(int device) {
  (void)torch::empty({0}, torch::TensorOptions().device(torch::kCUDA, static_cast<c10::DeviceIndex>(device)));
}

}  // namespace

AllocatorPeak cuda_allocator_peak(int device) {
  ensure_cuda_initialised(device);
  const auto peaks = compat::cuda_allocator_peaks(device);
  return {peaks.allocated_bytes, peaks.reserved_bytes};
}

void reset_cuda_allocator_peak(int device) {
  ensure_cuda_initialised(device);
  compat::reset_cuda_allocator_peaks(device);
}

int64_t cuda_device_total_bytes(int device) {
  ensure_cuda_initialised(device);
  size_t free_bytes = 0, total_bytes = 0;
  const c10::cuda::CUDAGuard on_device(static_cast<c10::DeviceIndex>(device));
  C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(total_bytes);
}

std::string cuda_device_pci_bus_id(int device) {
  char bus_id[32] = {};  // "dddd:bb:dd.f" plus a terminator fits in 13; CUDA documents 13 as enough
  C10_CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, static_cast<int>(sizeof bus_id), device));
  return bus_id;
}

}  // namespace ptrain::metrics
