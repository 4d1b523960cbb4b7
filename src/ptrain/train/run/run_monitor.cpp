#include "ptrain/train/run/run_monitor.h"

#include <utility>

#include "ptrain/metrics/cpu_allocator.h"
#include "ptrain/metrics/environment.h"

namespace ptrain::train {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

RunMonitor::RunMonitor(Options options)
    : options_(std::move(options)), phases_(options_.device),
      profiler_(options_.profile_out, options_.profile_first_step, options_.profile_last_step, options_.device,
                options_.is_main) {}

Progress RunMonitor::progress(int64_t epochs, int64_t steps_per_epoch) const {
  return Progress(options_.progress_style, epochs, steps_per_epoch);
}

void RunMonitor::start_gpu_sampler(const std::vector<torch::Device>& devices) {
  if (!options_.device.is_cuda()) return;
  std::vector<int> nvml_indices;
  for (const auto& device : devices) {
    metrics::reset_cuda_allocator_peak(device.index());
    const int nvml_index = metrics::nvml_index_for_cuda_device(device.index());
    if (nvml_index >= 0) nvml_indices.push_back(nvml_index);
  }
  if (!nvml_indices.empty()) {
    sampler_.emplace(nvml_indices);
    sampler_->start();
  }
}

void RunMonitor::stop_gpu_sampler() {
  if (sampler_) sampler_->stop();
}

void RunMonitor::track_phase_memory(int64_t cpu_baseline) {
  if (!options_.on_step_memory) return;
  phase_peaks_.emplace(options_.device.is_cuda() ? options_.device.index() : -1, cpu_baseline);
}

void RunMonitor::after_step(int64_t step, StepRunner& steps) {
  if (clock_.steady_starts_after(step)) {
    metrics::synchronize(options_.device);
    clock_.start_steady();
    phases_.start_counting();
    steps.take_replays();
  }
  // On the CPU the step's work is done when it returns, so the host's clock times each step; on CUDA only the
  // progress reads wait for the device, and a stretch of steps ends there.
  if (!options_.device.is_cuda()) clock_.mark(step);
}

void RunMonitor::collect_step_phases(StepRunner& steps) {
  phases_.collect();
  phases_.add_replayed_steps(steps.take_replays());
}

// Everything logged was already read from the device at those points (the window's loss), or is a host value
// (the learning rate, the allocator's counters): logging adds no wait for the device to the steps.
void RunMonitor::open_scalar_log(std::optional<int64_t> resumed_after) {
  if (options_.tensorboard.empty() && options_.log_jsonl.empty()) return;
  if (!options_.is_main) return;
  scalar_log_ = std::make_unique<metrics::ScalarLog>(options_.tensorboard, options_.log_jsonl, resumed_after);
}

void RunMonitor::log_progress(int64_t step, double epochs_done, double mean_loss, double samples_per_second,
                              double predictions_per_second, const StepScalars& step_scalars) {
  metrics::Scalars scalars{{"train/loss", mean_loss}, {"train/lr", step_scalars.lr}};
  if (step_scalars.loss_scale) scalars.emplace_back("train/loss_scale", *step_scalars.loss_scale);
  if (step_scalars.grad_norm) scalars.emplace_back("train/grad_norm", *step_scalars.grad_norm);
  if (step_scalars.tokens) {
    scalars.emplace_back("train/tokens_per_s", predictions_per_second);
  } else {
    scalars.emplace_back("train/images_per_s", samples_per_second);
  }
  if (const auto utilisation = flops_.at(samples_per_second)) {
    scalars.emplace_back("train/tflops", utilisation->tflops);
    if (utilisation->mfu) scalars.emplace_back("train/mfu", *utilisation->mfu);
  }
  // High-water marks since the run began: the allocator's on this process's device, and NVML's for the device.
  const torch::Device& device = options_.device;
  if (device.is_cuda()) {
    const auto peak = metrics::cuda_allocator_peak(device.index());
    if (peak.allocated_bytes) scalars.emplace_back("memory/peak_allocated_gib", *peak.allocated_bytes / kGiB);
    if (peak.reserved_bytes) scalars.emplace_back("memory/peak_reserved_gib", *peak.reserved_bytes / kGiB);
    if (sampler_) {
      const auto used = sampler_->stats().memory_used_peak;
      if (used) scalars.emplace_back("memory/peak_device_gib", static_cast<double>(*used) / kGiB);
    }
  } else if (device.is_cpu()) {
    scalars.emplace_back("memory/peak_allocated_gib", metrics::cpu_peak_allocated_bytes() / kGiB);
  }
  scalar_log_->log("step", step, epochs_done, scalars);
}

void RunMonitor::log_epoch(int64_t step, double epochs_done, const metrics::EpochRecord& epoch_record) {
  metrics::Scalars scalars{{"train/epoch_loss", epoch_record.train_loss}};
  if (epoch_record.train_accuracy) scalars.emplace_back("train/epoch_accuracy", *epoch_record.train_accuracy);
  if (epoch_record.test_loss) scalars.emplace_back("eval/loss", *epoch_record.test_loss);
  if (epoch_record.test_accuracy) scalars.emplace_back("eval/accuracy", *epoch_record.test_accuracy);
  scalar_log_->log("epoch", step, epochs_done, scalars);
}

std::vector<std::string> RunMonitor::logs_given_up() const {
  return scalar_log_ ? scalar_log_->failed() : std::vector<std::string>{};
}

}  // namespace ptrain::train
