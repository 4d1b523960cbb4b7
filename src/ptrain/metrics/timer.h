// Wall-clock timing on the host. Device time (CUDA events) is step_phases.h's DeviceInterval.
#pragma once

#include <chrono>

#include <torch/torch.h>

namespace ptrain::metrics {

// Waits until every kernel queued on a CUDA device has finished; nothing for other devices. Host
// timings of GPU work are only meaningful after it: kernel launches return before the work is done.
void synchronize(const torch::Device& device);

class Stopwatch {
 public:
  Stopwatch() { restart(); }
  void restart() { start_ = std::chrono::steady_clock::now(); }
  double elapsed_seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  // Synchronizes the device first, so that queued GPU work is inside the measurement (epoch timing).
  double elapsed_seconds_after_sync(const torch::Device& device) const {
    synchronize(device);
    return elapsed_seconds();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ptrain::metrics
