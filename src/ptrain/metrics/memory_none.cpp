// CPU builds: the device half of memory.h. There is no CUDA allocator to report on.
#include "ptrain/core/error.h"
#include "ptrain/metrics/memory.h"

namespace ptrain::metrics {

AllocatorPeak cuda_allocator_peak(int) { return {}; }

void reset_cuda_allocator_peak(int) {}

int64_t cuda_device_total_bytes(int device) {
  throw Error("cuda:" + std::to_string(device) + ": this build of ptrain has no CUDA");
}

std::string cuda_device_pci_bus_id(int device) {
  throw Error("cuda_device_pci_bus_id(" + std::to_string(device) + "): this ptrain was built without CUDA");
}

}  // namespace ptrain::metrics
