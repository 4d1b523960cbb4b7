// Host memory; the CUDA device's is in memory_cuda.cpp (CUDA builds) or memory_none.cpp (CPU builds).
#include "ptrain/metrics/memory.h"

#include <algorithm>
#include <fstream>

#include "ptrain/core/error.h"
#include "ptrain/metrics/cpu_allocator.h"

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

}  // namespace

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

PhasePeaks::PhasePeaks(int cuda_device, int64_t baseline) : cuda_device_(cuda_device), baseline_(baseline) {}

int64_t PhasePeaks::take() {
  int64_t peak = 0;
  if (cuda_device_ < 0) {
    peak = cpu_peak_allocated_bytes() - baseline_;
    reset_cpu_allocator_peak();
  } else {
    const AllocatorPeak read = cuda_allocator_peak(cuda_device_);
    check(read.allocated_bytes.has_value(), "cuda:" + std::to_string(cuda_device_) + ": no allocator peak to read");
    peak = *read.allocated_bytes - baseline_;
    if (read.reserved_bytes) highest_reserved_ = std::max(highest_reserved_.value_or(0), *read.reserved_bytes);
    reset_cuda_allocator_peak(cuda_device_);
  }
  highest_ = std::max(highest_, peak);
  return peak;
}

int64_t host_rss_bytes() { return proc_status_kib("VmRSS") * 1024; }
int64_t host_peak_rss_bytes() { return proc_status_kib("VmHWM") * 1024; }

}  // namespace ptrain::metrics
