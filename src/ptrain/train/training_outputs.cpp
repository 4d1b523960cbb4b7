// What the run tells of itself, each writer elsewhere: the scalars of a progress read for --tensorboard and
// --log-jsonl (run/run_monitor.h writes them; the log opened once the run knows the step it continues after),
// and the facts its record (run/run_recorder.h) is filled with once training has ended, read from the parts
// that measured or decided them. The learning rate, loss scale and gradient norm are the step engine's, all
// host values or already read from the device.
#include <optional>

#include "ptrain/kernels/cross_entropy.h"
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

void TrainingRun::fill_record(const std::optional<Evaluation>& last_eval) {
  RunRecorder::Facts facts;
  facts.model = plan_.model.name;
  facts.dataset = plan_.data.name;
  facts.precision = precision::record_name(policy());
  facts.strategy = strategy_->name();
  facts.device = device();
  facts.local_devices = local_devices();
  facts.world_size = strategy_->world_size();
  facts.devices = devices();
  facts.batch_size = plan_.length.batch_size;
  facts.grad_accum = plan_.length.grad_accum;
  facts.epochs = data_->epochs();
  facts.steps = position_.global_step;
  facts.steps_per_epoch = data_->steps_per_epoch();
  facts.micro_batches_per_epoch = data_->micro_batches_per_epoch();
  facts.image_size = data_->image_size();
  facts.seq_len = data_->sequence_length();
  facts.total_wall_seconds = monitor_.run_clock().elapsed_seconds();
  facts.clock = &monitor_.clock();
  facts.flops = &monitor_.flops();
  facts.phase_peaks = monitor_.phase_peaks();
  if (const auto* sampler = monitor_.gpu_sampler()) facts.gpu_stats = sampler->stats();
  if (last_eval) {
    facts.final_test_loss = last_eval->loss;
    facts.final_test_accuracy = last_eval->accuracy;
  }
  facts.trained_model = &engine_->model();
  facts.channels_last = plan_.channels_last;
  facts.cuda_graphs = engine_->captured();
  facts.optimizer_implementation = engine_->optimizer().implementation();
  facts.fused_kernels = plan_.model.fused_kernels;
  facts.fused_available = plan_.model.fused_kernels && kernels::fused_kernels_available(device());
  facts.relu_recompute = plan_.model.relu_recompute;
  facts.skip_fusions = plan_.model.skip_fusions;
  facts.step_phase_seconds = monitor_.phases().means().to_json();
  facts.config = plan_.settings;
  facts.diverged_at_step = stop_rules_.diverged_at_step();
  facts.streamed_data = data_->train_set().is_streamed();
  facts.loader_threads = plan_.data_options.loader_threads;
  facts.loader_wait_seconds = data_->train_loader().wait_seconds();
  facts.warns = strategy_->is_main();
  recorder_.fill(facts);
  checkpoints_.record(recorder_.record());
}

}  // namespace ptrain::train
