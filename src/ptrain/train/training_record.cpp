// The run's metrics record (metrics/run_record.h, documented in docs/metrics.md), assembled once training
// has ended: throughput, memory peaks, utilisation, accuracy, what ran and where.
#include <algorithm>
#include <iostream>

#include "ptrain/core/text.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/kernels/cross_entropy.h"
#include "ptrain/metrics/cpu_allocator.h"
#include "ptrain/metrics/environment.h"
#include "ptrain/metrics/memory.h"
#include "ptrain/models/batch_norm.h"
#include "ptrain/train/training_run.h"

namespace ptrain::train {

void TrainingRun::fill_record(const metrics::Stopwatch& run_clock, const std::optional<Evaluation>& last_eval) {
  record_what_ran_and_how_fast(run_clock);
  record_memory_and_utilisation();
  if (last_eval) {
    record_.final_test_accuracy = last_eval->accuracy;
    record_.final_test_loss = last_eval->loss;
  }
  record_implementation();
}

// The workload, its layout over the devices, and the throughput of its training (steady and overall).
void TrainingRun::record_what_ran_and_how_fast(const metrics::Stopwatch& run_clock) {
  record_.model = c_.model.name;
  record_.dataset = c_.data.dataset;
  record_.precision = precision::record_name(policy_);
  record_.strategy = strategy_->name();
  record_.device = device_.str();
  record_.world_size = strategy_->world_size();
  record_.devices = devices();
  record_.batch_size_per_device = c_.run.batch_size;
  record_.global_batch_size = c_.run.batch_size * c_.optim.grad_accum * devices();
  record_.epochs = epochs_;
  record_.steps = global_step_;
  record_.image_size = train_set_.is_tokens() ? 0 : c_.data.image_size > 0 ? c_.data.image_size : train_set_.height();
  record_.train_wall_seconds = clock_.train_seconds();
  record_.total_wall_seconds = run_clock.elapsed_seconds();
  if (checkpointer_) {
    record_.checkpoint_blocking_seconds = checkpoint_blocking_.total();
    record_.extra["checkpoint_blocking"] = {{"saves", checkpoint_blocking_.saves},
                                            {"waits", checkpoint_blocking_.waits},
                                            {"end_wait", checkpoint_blocking_.end_wait}};
    if (checkpointer_->async()) {
      record_.checkpoint_write_seconds = checkpointer_->write_seconds();
      record_.extra["checkpoint_writes"] = checkpointer_->writes_seconds();
      nlohmann::json phases = nlohmann::json::array();
      for (const auto& p : checkpointer_->writes_phases())
        phases.push_back({{"files", p.files},
                          {"copies_queued", p.copies_queued},
                          {"copies_waited", p.copies_waited},
                          {"pruning", p.pruning}});
      record_.extra["checkpoint_write_phases"] = std::move(phases);
    }
    if (const auto staging = checkpointer_->staging()) record_.extra["checkpoint_staging"] = to_string(*staging);
  }
  record_.images_per_second = clock_.train_seconds() > 0 ? clock_.images() / clock_.train_seconds() : 0;
  if (clock_.steady_steps() > 0 && clock_.steady_seconds() > 0) {
    record_.steady_from_step = clock_.steady_from_step();
    // accum micro-batches a step, but an epoch's last step takes the ones left (short_by fewer).
    const int64_t from = clock_.steady_from_step(), to = from + clock_.steady_steps();
    const int64_t short_by = steps_per_epoch_ * c_.optim.grad_accum - micro_batches_per_epoch_;
    const int64_t micro_batches =
        clock_.steady_steps() * c_.optim.grad_accum - (to / steps_per_epoch_ - from / steps_per_epoch_) * short_by;
    record_.steady_images_per_second =
        static_cast<double>(micro_batches * c_.run.batch_size * devices()) / clock_.steady_seconds();
  }
  metrics::set_steady_steps(record_, clock_.steady_step_seconds(), device_.is_cuda() ? "window" : "step");
  const double samples_per_second = record_.steady_images_per_second.value_or(record_.images_per_second);
  if (const auto utilisation = flops_.at(samples_per_second)) {
    record_.model_flops_per_step = utilisation->model_flops_per_step;
    record_.tflops = utilisation->tflops;
    record_.mfu = utilisation->mfu;
  }
  if (flops_.peak()) {
    record_.peak_tflops = flops_.peak()->flops_per_second / 1e12;
    record_.peak_tflops_basis = flops_.peak()->basis;
  }
  if (train_set_.is_tokens()) {  // a sequence counts as an image above; these count its tokens
    record_.seq_len = train_set_.images.size(1);
    record_.tokens_per_second = record_.images_per_second * static_cast<double>(*record_.seq_len);
    if (record_.steady_images_per_second)
      record_.steady_tokens_per_second = *record_.steady_images_per_second * static_cast<double>(*record_.seq_len);
  }
}

// Peaks of host, allocator and device memory, and the GPUs' utilisation while training.
void TrainingRun::record_memory_and_utilisation() {
  record_.host_peak_rss_bytes = metrics::host_peak_rss_bytes();
  if (device_.is_cpu())
    record_.peak_allocated_bytes = metrics::cpu_peak_allocated_bytes() - cpu_bytes_before_model_;
  for (const auto& device : local_devices()) {
    if (!device.is_cuda()) break;
    // Per GPU: the highest of this process's devices (under dp the first one, which gathers the outputs).
    const auto peak = metrics::cuda_allocator_peak(device.index());
    if (peak.allocated_bytes && (!record_.peak_allocated_bytes || *peak.allocated_bytes > *record_.peak_allocated_bytes))
      record_.peak_allocated_bytes = peak.allocated_bytes;
    if (peak.reserved_bytes && (!record_.peak_reserved_bytes || *peak.reserved_bytes > *record_.peak_reserved_bytes))
      record_.peak_reserved_bytes = peak.reserved_bytes;
  }
  if (phase_peaks_) {  // its resets left the allocator the last phase's peak alone
    record_.peak_allocated_bytes = std::max(record_.peak_allocated_bytes.value_or(0), phase_peaks_->highest());
    if (phase_peaks_->highest_reserved())
      record_.peak_reserved_bytes = std::max(record_.peak_reserved_bytes.value_or(0), *phase_peaks_->highest_reserved());
  }
  if (sampler_) {
    const auto stats = sampler_->stats();
    record_.gpu_util_mean = stats.util_mean;
    record_.gpu_util_peak = stats.util_peak;
    record_.peak_nvml_used_bytes = stats.memory_used_peak;
  }
}

namespace {

bool uses_ptrain_batch_norm(torch::nn::Module& model) {
  for (const auto& module : model.modules(/*include_self=*/false))
    if (dynamic_cast<const models::BatchNorm2dImpl*>(module.get())) return true;
  return false;
}

}  // namespace

// What computed the run: kernels, CUDA graphs, versions, the environment, the config and the loader.
void TrainingRun::record_implementation() {
  record_.channels_last = plan_.channels_last;
  record_.cuda_graphs = steps_ && steps_->captured();
  const bool fused_here = c_.run.fused_kernels && kernels::fused_kernels_available(device_);
  record_.kernels = {{"optimizer", optimizer_->implementation()},
                     {"cross_entropy", fused_here ? "fused" : "reference"}};
  record_.fused_optimizer = optimizer_->implementation() == "fused";
  // Only models built on ptrain's own batch norm reach its fused kernels: a TorchScript network or a
  // user's module with torch::nn norms runs LibTorch's, and a record must not say otherwise.
  if (uses_ptrain_batch_norm(*model_)) {
    const bool fused_norms = fused_here && plan_.channels_last;
    record_.kernels["batch_norm_relu"] = fused_norms ? "fused" : "reference";
    // Whether the outputs feeding convolutions were recomputed in the backward (--relu-recompute).
    if (fused_norms) record_.kernels["relu_before_conv"] = c_.run.relu_recompute ? "recomputed" : "kept";
    // Where the convolutions handed their statistics to the batch norms (--conv-bn-fusion), as the last
    // training forward took it.
    const std::string conv_bn = model_->describe_conv_bn_fusion();
    if (fused_norms && !conv_bn.empty()) record_.kernels["conv_bn_fusion"] = conv_bn;
  }
  // The fused paths --skip-fusions left out: a run without one is measured as such.
  if (c_.run.fused_kernels && !c_.run.skip_fusions.empty()) {
    record_.kernels["skipped_fusions"] = join(c_.run.skip_fusions, ",");
    // A skip another path made moot measured nothing: the record says so, and so does the run's end.
    std::vector<std::string> without_effect;
    for (const auto& bypassed : model_->fusions_bypassed())
      if (std::count(c_.run.skip_fusions.begin(), c_.run.skip_fusions.end(), bypassed)) without_effect.push_back(bypassed);
    if (!without_effect.empty()) {
      record_.kernels["skipped_fusions_without_effect"] = join(without_effect, ",");
      if (strategy_->is_main())
        std::cerr << "ptrain: warning: --skip-fusions " << join(without_effect, ",")
                  << " had no effect: the last training forward ran another path in its place (kernels.conv_bn_fusion: "
                  << model_->describe_conv_bn_fusion() << ")" << std::endl;
    }
  }
  // Which form of the ImageNet stem's convolution the last training forward ran (ResNets only).
  if (const std::string stem = model_->describe_stem_conv(); !stem.empty()) record_.kernels["stem_conv"] = stem;
  record_.step_phase_seconds = phases_.means().to_json();
  record_.ptrain_version = PTRAIN_VERSION;
  record_.torch_version = compat::torch_version();
  record_.environment = metrics::describe_environment(device_);
  record_.extra["config"] = config::to_json(c_);
  record_.diverged_at_step = stop_rules_.diverged_at_step();
  // How long the training step waited for its batches (host time in the loader's next()): a loader that
  // cannot keep up shows here. Documented in docs/metrics.md.
  record_.extra["data_loader"] = {{"image_loading", train_set_.is_streamed() ? "stream" : "memory"},
                                  {"threads", c_.data.loader_threads},
                                  {"wait_seconds", train_loader_->wait_seconds()},
                                  {"wait_fraction", clock_.train_seconds() > 0 ? train_loader_->wait_seconds() / clock_.train_seconds() : 0.0}};
}

}  // namespace ptrain::train
