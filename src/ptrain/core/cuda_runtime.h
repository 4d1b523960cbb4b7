// The few CUDA runtime calls that code shared by both builds needs. CUDA builds define them in
// cuda_runtime_cuda.cpp, CPU builds in cuda_runtime_none.cpp (CMake picks one), so that callers never ask
// which build they are in.
#pragma once

#include <string>

namespace ptrain::cuda_runtime {

// Throws ptrain::Error "<what>: this ptrain was built against a LibTorch without CUDA" in CPU builds;
// nothing in CUDA builds.
void require_cuda_build(const std::string& what);

// Makes device the calling thread's current CUDA device (NCCL and the caching allocator work on it).
// CPU builds: throws ptrain::Error.
void set_current_device(int device);

// The calling thread's current CUDA device. CPU builds: throws ptrain::Error.
int current_device();

// The compute capability of CUDA device `device` as major * 10 + minor (90 for an H100 or H200). CPU builds:
// throws ptrain::Error.
int compute_capability(int device);

// What a device's peak arithmetic rate is computed from (metrics/flops.h).
struct DeviceProperties {
  std::string name;            // "NVIDIA H100 80GB HBM3"
  int multiprocessors = 0;
  int max_clock_khz = 0;       // the multiprocessors' peak clock
  int compute_capability = 0;  // major * 10 + minor
};

// CPU builds: throws ptrain::Error.
DeviceProperties device_properties(int device);

}  // namespace ptrain::cuda_runtime
