// The facts the run's record (run/run_recorder.h) is filled with once training has ended, read from the parts
// that measured or decided them, and the record's sections that parts write themselves (the checkpoints').
#include "ptrain/kernels/cross_entropy.h"
#include "ptrain/train/training_run.h"

namespace ptrain::train {

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
