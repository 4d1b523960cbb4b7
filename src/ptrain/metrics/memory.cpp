#include "ptrain/metrics/memory.h"

#include <fstream>

#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"

#if PTRAIN_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace ptrain::metrics {
namespace {

// /proc/self/status has no library reader in Debian's set; its "Key:   1234 kB" lines are simple.
int64_t proc_status_kib(const std::string& key) {
  const std::string path = "/proc/self/status";
  std::ifstream in(path);
  check(in.good(), "cannot read " + path + ": host memory needs Linux's /proc");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size() + 1, key + ":") != 0) continue;
    const auto digits = line.find_first_of("0123456789");
    check(digits != std::string::npos, path + ": no value in line '" + line + "'");
    return std::stoll(line.substr(digits));
  }
  throw Error(path + " has no " + key + " line");
}

#if PTRAIN_WITH_CUDA
// The caching allocator learns the device count on CUDA's lazy initialisation, and refuses queries
// for devices before it ("Invalid device argument"). Creating an empty tensor initialises CUDA the
// same way in every release, unlike the Context method, renamed in 2.x.
void ensure_cuda_initialised(int device) {
  (void)torch::empty({0}, torch::TensorOptions().device(torch::kCUDA, static_cast<c10::DeviceIndex>(device)));
}
#endif

}  // namespace

AllocatorPeak cuda_allocator_peak(int device) {
#if PTRAIN_WITH_CUDA
  ensure_cuda_initialised(device);
  const auto peaks = compat::cuda_allocator_peaks(device);
  return {peaks.allocated_bytes, peaks.reserved_bytes};
#else
  (void)device;
  return {};
#endif
}

void reset_cuda_allocator_peak(int device) {
#if PTRAIN_WITH_CUDA
  ensure_cuda_initialised(device);
  compat::reset_cuda_allocator_peaks(device);
#else
  (void)device;
#endif
}

int64_t cuda_device_total_bytes(int device) {
#if PTRAIN_WITH_CUDA
  ensure_cuda_initialised(device);
  size_t free_bytes = 0, total_bytes = 0;
  const c10::cuda::CUDAGuard on_device(static_cast<c10::DeviceIndex>(device));
  C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(total_bytes);
#else
  throw Error("cuda:" + std::to_string(device) + ": this build of ptrain has no CUDA");
#endif
}

int64_t host_total_bytes() {
  const std::string path = "/proc/meminfo";
  std::ifstream in(path);
  check(in.good(), "cannot read " + path + ": host memory needs Linux's /proc");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemTotal:", 0) != 0) continue;
    const auto digits = line.find_first_of("0123456789");
    check(digits != std::string::npos, path + ": no value in line '" + line + "'");
    return std::stoll(line.substr(digits)) * 1024;
  }
  throw Error(path + " has no MemTotal line");
}

int64_t host_rss_bytes() { return proc_status_kib("VmRSS") * 1024; }
int64_t host_peak_rss_bytes() { return proc_status_kib("VmHWM") * 1024; }

std::string cuda_device_pci_bus_id(int device) {
#if PTRAIN_WITH_CUDA
  char bus_id[32] = {};  // "dddd:bb:dd.f" plus a terminator fits in 13; CUDA documents 13 as enough
  C10_CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, static_cast<int>(sizeof bus_id), device));
  return bus_id;
#else
  throw Error("cuda_device_pci_bus_id(" + std::to_string(device) + "): this ptrain was built without CUDA");
#endif
}

}  // namespace ptrain::metrics
