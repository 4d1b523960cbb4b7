// The CUDA runtime calls ptrain's kernel launchers make, for the CPU emulation (cuda_emulation.h): a device of
// kEmulatedMultiprocessors multiprocessors, memory the host's. Anything else the launchers would ask is refused.
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

}  // extern "C"
