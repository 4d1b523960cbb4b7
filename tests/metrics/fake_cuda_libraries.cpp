// Stand-ins for the version entry points of the CUDA runtime, cuDNN and NCCL, with fixed answers:
// loaded with RTLD_GLOBAL, they let the environment record's version lookup be tested without a GPU.
#include <cstddef>

extern "C" {
int cudaRuntimeGetVersion(int* version) {
  *version = 12040;  // 12.4
  return 0;
}
size_t cudnnGetVersion() { return 90100; }  // 9.1.0
int ncclGetVersion(int* version) {
  *version = 22106;  // 2.21.6
  return 0;
}
}
