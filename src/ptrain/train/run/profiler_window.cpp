#include "ptrain/train/run/profiler_window.h"

#include <iostream>
#include <utility>

#include "ptrain/core/torch_compat.h"
#include "ptrain/metrics/timer.h"

namespace ptrain::train {

ProfilerWindow::ProfilerWindow(std::string out, int64_t first_step, int64_t last_step, const torch::Device& device,
                               bool announces)
    : out_(std::move(out)), first_step_(first_step), last_step_(last_step), device_(device), announces_(announces) {}

void ProfilerWindow::before_step(int64_t step) {
  if (out_.empty()) return;
  if (!tracing_ && step == first_step_) {
    metrics::synchronize(device_);
    compat::start_profiler_trace(device_.is_cuda(), out_);
    tracing_ = true;
  }
  if (tracing_) traced_step_.emplace("ProfilerStep#" + std::to_string(step));
}

void ProfilerWindow::after_step(int64_t step) {
  if (out_.empty()) return;
  traced_step_.reset();
  if (tracing_ && step == last_step_) {
    metrics::synchronize(device_);
    compat::stop_profiler_trace();
    tracing_ = false;
    if (announces_)
      std::cout << "trace of steps " << first_step_ << "-" << last_step_ << " written to " << out_ << std::endl;
  }
}

void ProfilerWindow::finish(int64_t last_step_done) {
  if (!tracing_) return;
  metrics::synchronize(device_);
  compat::stop_profiler_trace();
  tracing_ = false;
  if (announces_)
    std::cout << "trace of steps " << first_step_ << "-" << last_step_done << " (the run's last) written to " << out_
              << std::endl;
}

}  // namespace ptrain::train
