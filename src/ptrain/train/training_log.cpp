// --tensorboard and --log-jsonl: the scalars of each progress read and each epoch's end, written by rank 0.
// Everything logged was already read from the device at those points (the window's loss), or is a host
// value (the learning rate, the allocator's counters): logging adds no wait for the device to the steps.
#include <optional>

#include "ptrain/metrics/cpu_allocator.h"
#include "ptrain/metrics/memory.h"
#include "ptrain/train/training_run.h"

namespace ptrain::train {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

void TrainingRun::open_scalar_log() {
  if (c_.run.tensorboard.empty() && c_.run.log_jsonl.empty()) return;
  if (!strategy_->is_main()) return;
  const std::optional<int64_t> resumed_after =
      plan_.resume_path.empty() ? std::nullopt : std::optional<int64_t>(global_step_);
  scalar_log_ = std::make_unique<metrics::ScalarLog>(c_.run.tensorboard, c_.run.log_jsonl, resumed_after);
  // The norm that clipping computes anyway, kept in a tensor of its own that a captured step writes too;
  // without clipping no norm is computed, and none is logged.
  if (c_.optim.clip_grad_norm > 0)
    last_grad_norm_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
}

double TrainingRun::epochs_done() const {
  return steps_per_epoch_ > 0 ? static_cast<double>(global_step_) / static_cast<double>(steps_per_epoch_) : 0;
}

void TrainingRun::log_progress(double mean_loss, double samples_per_second, double predictions_per_second) {
  metrics::Scalars scalars{{"train/loss", mean_loss}, {"train/lr", schedule_->lr(global_step_ - 1)}};
  if (scaler_) scalars.emplace_back("train/loss_scale", scaler_->current_scale());
  if (last_grad_norm_.defined()) scalars.emplace_back("train/grad_norm", last_grad_norm_.item<double>());
  if (train_set_.is_tokens()) {
    scalars.emplace_back("train/tokens_per_s", predictions_per_second);
  } else {
    scalars.emplace_back("train/images_per_s", samples_per_second);
  }
  if (const auto utilisation = flops_.at(samples_per_second)) {
    scalars.emplace_back("train/tflops", utilisation->tflops);
    if (utilisation->mfu) scalars.emplace_back("train/mfu", *utilisation->mfu);
  }
  // High-water marks since the run began: the allocator's on this process's device, and NVML's for the device.
  if (device_.is_cuda()) {
    const auto peak = metrics::cuda_allocator_peak(device_.index());
    if (peak.allocated_bytes) scalars.emplace_back("memory/peak_allocated_gib", *peak.allocated_bytes / kGiB);
    if (peak.reserved_bytes) scalars.emplace_back("memory/peak_reserved_gib", *peak.reserved_bytes / kGiB);
    if (sampler_) {
      const auto used = sampler_->stats().memory_used_peak;
      if (used) scalars.emplace_back("memory/peak_device_gib", static_cast<double>(*used) / kGiB);
    }
  } else if (device_.is_cpu()) {
    scalars.emplace_back("memory/peak_allocated_gib", metrics::cpu_peak_allocated_bytes() / kGiB);
  }
  scalar_log_->log("step", global_step_, epochs_done(), scalars);
}

void TrainingRun::log_epoch(const metrics::EpochRecord& epoch_record) {
  metrics::Scalars scalars{{"train/epoch_loss", epoch_record.train_loss}};
  if (epoch_record.train_accuracy) scalars.emplace_back("train/epoch_accuracy", *epoch_record.train_accuracy);
  if (epoch_record.test_loss) scalars.emplace_back("eval/loss", *epoch_record.test_loss);
  if (epoch_record.test_accuracy) scalars.emplace_back("eval/accuracy", *epoch_record.test_accuracy);
  scalar_log_->log("epoch", global_step_, epochs_done(), scalars);
}

}  // namespace ptrain::train
