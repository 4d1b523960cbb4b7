// CPU builds: there is no CUDA runtime; every call that needs one says so.
#include "ptrain/core/cuda_runtime.h"

#include "ptrain/core/error.h"

namespace ptrain::cuda_runtime {

void require_cuda_build(const std::string& what) {
  throw Error(what + ": this ptrain was built against a LibTorch without CUDA");
}

void set_current_device(int device) { require_cuda_build("cuda:" + std::to_string(device)); }

int current_device() {
  require_cuda_build("the current CUDA device");
  return -1;
}

int compute_capability(int device) {
  require_cuda_build("the compute capability of cuda:" + std::to_string(device));
  return 0;
}

DeviceProperties device_properties(int device) {
  require_cuda_build("the properties of cuda:" + std::to_string(device));
  return {};
}

}  // namespace ptrain::cuda_runtime
