// The run's side of --tensorboard and --log-jsonl (run/run_monitor.h writes them): the log opened once the run
// knows the step it continues after, and a progress read's scalars of the parts that own them (the learning
// rate, the loss scale, the gradient norm), all host values or already read from the device.
#include <optional>

#include "ptrain/train/training_run.h"

namespace ptrain::train {

void TrainingRun::open_scalar_log() {
  monitor_.open_scalar_log(plan_.resume_path.empty() ? std::nullopt : std::optional<int64_t>(position_.global_step));
  // The norm that clipping computes anyway, kept in a tensor of its own that a captured step writes too.
  if (monitor_.logging()) engine_->keep_grad_norm();
}

double TrainingRun::epochs_done() const {
  const int64_t per_epoch = data_->steps_per_epoch();
  return per_epoch > 0 ? static_cast<double>(position_.global_step) / static_cast<double>(per_epoch) : 0;
}

void TrainingRun::log_progress(double mean_loss, double samples_per_second, double predictions_per_second) {
  RunMonitor::StepScalars step_scalars;
  step_scalars.lr = engine_->lr(position_.global_step - 1);
  step_scalars.loss_scale = engine_->loss_scale();
  step_scalars.grad_norm = engine_->grad_norm();
  step_scalars.tokens = data_->train_set().is_tokens();
  monitor_.log_progress(position_.global_step, epochs_done(), mean_loss, samples_per_second, predictions_per_second,
                        step_scalars);
}

}  // namespace ptrain::train
