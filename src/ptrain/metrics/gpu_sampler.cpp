#include "ptrain/metrics/gpu_sampler.h"

#include <algorithm>

#include "ptrain/core/error.h"

namespace ptrain::metrics {

GpuSampler::GpuSampler(std::vector<int> nvml_indices, std::chrono::milliseconds period, Nvml& nvml)
    : indices_(std::move(nvml_indices)), period_(period), nvml_(nvml) {
  check(period_.count() > 0, "GpuSampler: the sampling period must be positive");
}

GpuSampler::~GpuSampler() { stop(); }

void GpuSampler::start() {
  check(!thread_.joinable(), "GpuSampler: start() called while already running");
  if (!nvml_.available() || indices_.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_requested_ = false;
  }
  thread_ = std::thread([this] { run(); });
}

void GpuSampler::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_requested_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void GpuSampler::run() {
  sample_once();  // at once: a run shorter than one period still gets a reading
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, period_, [this] { return stop_requested_; })) {
    lock.unlock();
    sample_once();
    lock.lock();
  }
}

void GpuSampler::sample_once() {
  // NVML calls happen outside the lock: they take milliseconds, and stats() must not wait on them.
  double util_total = 0.0;
  int util_readings = 0;
  std::optional<double> util_max;
  std::optional<uint64_t> memory_max;
  for (int index : indices_) {
    if (const auto util = nvml_.utilization_percent(index)) {
      util_total += *util;
      ++util_readings;
      util_max = std::max(util_max.value_or(0.0), static_cast<double>(*util));
    }
    if (const auto used = nvml_.memory_used_bytes(index)) memory_max = std::max(memory_max.value_or(0), *used);
  }
  if (util_readings == 0 && !memory_max) return;
  std::lock_guard<std::mutex> lock(mutex_);
  ++samples_;
  if (util_readings > 0) {
    util_sum_ += util_total / util_readings;
    ++util_samples_;
    util_peak_ = std::max(util_peak_.value_or(0.0), *util_max);
  }
  if (memory_max) memory_peak_ = std::max(memory_peak_.value_or(0), *memory_max);
}

GpuSampler::Stats GpuSampler::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Stats s;
  s.samples = samples_;
  if (util_samples_ > 0) s.util_mean = util_sum_ / static_cast<double>(util_samples_);
  s.util_peak = util_peak_;
  s.memory_used_peak = memory_peak_;
  return s;
}

}  // namespace ptrain::metrics
