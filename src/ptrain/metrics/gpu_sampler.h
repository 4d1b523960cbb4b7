// Samples GPU utilisation and device memory through NVML on a background thread while training runs.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "ptrain/metrics/nvml.h"

namespace ptrain::metrics {

class GpuSampler {
 public:
  // nvml_indices: NVML's numbering (see Nvml::index_for_pci_bus_id). The NVML instance must outlive
  // the sampler. Every 10 ms: device memory rises and falls within a step (a captured step's warm-up, the final
  // evaluation), and at 100 ms the same GPT-2 small run read a peak 2 GiB apart from one run to the next on one
  // H200. NVML's utilisation is its own average over a longer window, read as often.
  explicit GpuSampler(std::vector<int> nvml_indices,
                      std::chrono::milliseconds period = std::chrono::milliseconds(10),
                      Nvml& nvml = Nvml::instance());
  ~GpuSampler();  // stops
  GpuSampler(const GpuSampler&) = delete;
  GpuSampler& operator=(const GpuSampler&) = delete;

  // Starts the thread (takes one sample at once, then one per period). Without NVML or devices it
  // starts nothing and stats() stays empty. Throws ptrain::Error when already running.
  void start();
  // Joins the thread; idempotent.
  void stop();

  struct Stats {
    std::optional<double> util_mean;  // mean over samples of the mean over devices, percent
    std::optional<double> util_peak;  // highest single reading, percent
    std::optional<uint64_t> memory_used_peak;  // highest single device's used memory, bytes
    int64_t samples = 0;  // sampling rounds with at least one reading
  };
  // Safe to call while running. Empty optionals when nothing was read: never a made-up number.
  Stats stats() const;

 private:
  void run();
  void sample_once();

  std::vector<int> indices_;
  std::chrono::milliseconds period_;
  Nvml& nvml_;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_requested_ = false;

  // Guarded by mutex_.
  double util_sum_ = 0.0;
  int64_t util_samples_ = 0;
  std::optional<double> util_peak_;
  std::optional<uint64_t> memory_peak_;
  int64_t samples_ = 0;
};

}  // namespace ptrain::metrics
