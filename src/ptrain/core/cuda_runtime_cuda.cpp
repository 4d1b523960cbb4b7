// CUDA builds: the runtime calls of cuda_runtime.h on c10's CUDA functions.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>

#include "ptrain/core/cuda_runtime.h"

namespace ptrain::cuda_runtime {

void require_cuda_build(const std::string&) {}

void set_current_device(int device) { c10::cuda::set_device(static_cast<c10::DeviceIndex>(device)); }

int current_device() { return static_cast<int>(c10::cuda::current_device()); }

int compute_capability(int device) {
  const cudaDeviceProp* properties = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device));
  return properties->major * 10 + properties->minor;
}

DeviceProperties device_properties(int device) {
  const cudaDeviceProp* properties = at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device));
  DeviceProperties p;
  p.name = properties->name;
  p.multiprocessors = properties->multiProcessorCount;
  p.compute_capability = properties->major * 10 + properties->minor;
  // An attribute, not cudaDeviceProp::clockRate, which CUDA 13 removed.
  if (cudaDeviceGetAttribute(&p.max_clock_khz, cudaDevAttrClockRate, device) != cudaSuccess) {
    (void)cudaGetLastError();
    p.max_clock_khz = 0;
  }
  return p;
}

}  // namespace ptrain::cuda_runtime
