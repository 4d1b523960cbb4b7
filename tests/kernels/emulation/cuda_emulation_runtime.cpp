// The CUDA runtime calls ptrain's kernel launchers make, for the CPU emulation (cuda_emulation.h): a device of
// kEmulatedMultiprocessors multiprocessors, memory the host's, and the intrinsics nvcc would inline. Anything else
// the launchers would ask is refused.
#include <cmath>
#include <cstring>

#include "cuda_emulation.h"

extern "C" {

cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int) {
  if (attribute != cudaDevAttrMultiProcessorCount) return cudaErrorInvalidValue;
  *value = ptrain_emulation::kEmulatedMultiprocessors;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}

const char* CUDARTAPI cudaGetErrorString(cudaError_t) { return "an error of the emulated CUDA runtime"; }

// The device's fast exponential (ex2.approx on a GPU, within 2 ulp there): the exact one here.
float __expf(float x) { return std::exp(x); }

}  // extern "C"
