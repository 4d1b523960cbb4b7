// Memory high-water marks: the CUDA caching allocator's (what tensors took and what the allocator
// reserved from the driver) and the process's resident set on the host.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ptrain::metrics {

struct AllocatorPeak {
  std::optional<int64_t> allocated_bytes;
  std::optional<int64_t> reserved_bytes;
};

// Peaks since the last reset_cuda_allocator_peak(device) (or the process start). CPU builds: nullopt.
AllocatorPeak cuda_allocator_peak(int device);
void reset_cuda_allocator_peak(int device);  // no-op in CPU builds

// The allocator's peak phase by phase on one device (ptrain estimate's probes read a step's forward and
// backward apart from its update). Each take() returns the peak since the previous take() and resets the
// allocator's peak to what is held now. A reset loses the peak a run reports at its end, so highest() keeps the
// largest of every phase (and highest_reserved() the CUDA allocator's reserved bytes).
class PhasePeaks {
 public:
  // cuda_device: a CUDA device's index, or -1 for the CPU's counting allocator (metrics/cpu_allocator.h).
  // baseline: bytes taken off every reading, as a CPU run leaves out the tensors held before its model.
  PhasePeaks(int cuda_device, int64_t baseline);
  int64_t take();
  int64_t highest() const { return highest_; }
  std::optional<int64_t> highest_reserved() const { return highest_reserved_; }

 private:
  int cuda_device_;
  int64_t baseline_;
  int64_t highest_ = 0;
  std::optional<int64_t> highest_reserved_;
};

// VmRSS and VmHWM of /proc/self/status, in bytes. Throws ptrain::Error when the file cannot be read
// or lacks the field (not Linux).
int64_t host_rss_bytes();
int64_t host_peak_rss_bytes();

// Total memory of a CUDA device (CPU builds: throws ptrain::Error), and the host's (MemTotal of
// /proc/meminfo; throws ptrain::Error without it).
int64_t cuda_device_total_bytes(int device);
int64_t host_total_bytes();

// "0000:3B:00.0" for a CUDA device index, the key that maps it to NVML's numbering.
// CPU builds: throws ptrain::Error.
std::string cuda_device_pci_bus_id(int device);

}  // namespace ptrain::metrics
