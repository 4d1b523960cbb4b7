#include "ptrain/train/run/run_recorder.h"

#include <algorithm>
#include <iostream>
#include <utility>

#include "ptrain/core/text.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/metrics/cpu_allocator.h"
#include "ptrain/metrics/environment.h"
#include "ptrain/models/batch_norm.h"

namespace ptrain::train {

namespace {

bool uses_ptrain_batch_norm(torch::nn::Module& model) {
  for (const auto& module : model.modules(/*include_self=*/false))
    if (dynamic_cast<const models::BatchNorm2dImpl*>(module.get())) return true;
  return false;
}

}  // namespace

RunRecorder::RunRecorder(std::string command_line) { record_.command_line = std::move(command_line); }

void RunRecorder::count_cpu_from_here() {
  metrics::reset_cpu_allocator_peak();
  cpu_bytes_before_model_ = metrics::cpu_allocated_bytes();
}

void RunRecorder::note_model(std::string summary_line, nlohmann::json summary) {
  model_summary_ = std::move(summary_line);
  record_.extra["model_summary"] = std::move(summary);
}

void RunRecorder::note_fp8(std::string summary_line, nlohmann::json layers) {
  fp8_summary_ = std::move(summary_line);
  record_.extra["fp8_layers"] = std::move(layers);
}

void RunRecorder::note_model_states(int64_t params, int64_t grads, int64_t optimizer) {
  record_.model_state_param_bytes = params;
  record_.model_state_grad_bytes = grads;
  record_.model_state_optimizer_bytes = optimizer;
}

void RunRecorder::fill(const Facts& facts) {
  record_what_ran_and_how_fast(facts);
  record_memory_and_utilisation(facts);
  if (facts.final_test_accuracy) record_.final_test_accuracy = facts.final_test_accuracy;
  if (facts.final_test_loss) record_.final_test_loss = facts.final_test_loss;
  record_implementation(facts);
}

// The workload, its layout over the devices, and the throughput of its training (steady and overall).
void RunRecorder::record_what_ran_and_how_fast(const Facts& facts) {
  const ThroughputClock& throughput = *facts.clock;
  const RunFlops& flops = *facts.flops;
  record_.model = facts.model;
  record_.dataset = facts.dataset;
  record_.precision = facts.precision;
  record_.strategy = facts.strategy;
  record_.device = facts.device.str();
  record_.world_size = facts.world_size;
  record_.devices = facts.devices;
  record_.batch_size_per_device = facts.batch_size;
  record_.global_batch_size = facts.batch_size * facts.grad_accum * facts.devices;
  record_.epochs = facts.epochs;
  record_.steps = facts.steps;
  record_.image_size = facts.image_size;
  record_.train_wall_seconds = throughput.train_seconds();
  record_.total_wall_seconds = facts.total_wall_seconds;
  record_.images_per_second = throughput.train_seconds() > 0 ? throughput.images() / throughput.train_seconds() : 0;
  if (throughput.steady_steps() > 0 && throughput.steady_seconds() > 0) {
    record_.steady_from_step = throughput.steady_from_step();
    // accum micro-batches a step, but an epoch's last step takes the ones left (short_by fewer).
    const int64_t from = throughput.steady_from_step(), to = from + throughput.steady_steps();
    const int64_t per_epoch = facts.steps_per_epoch;
    const int64_t short_by = per_epoch * facts.grad_accum - facts.micro_batches_per_epoch;
    const int64_t micro_batches =
        throughput.steady_steps() * facts.grad_accum - (to / per_epoch - from / per_epoch) * short_by;
    record_.steady_images_per_second =
        static_cast<double>(micro_batches * facts.batch_size * facts.devices) / throughput.steady_seconds();
  }
  metrics::set_steady_steps(record_, throughput.steady_step_seconds(), facts.device.is_cuda() ? "window" : "step");
  const double samples_per_second = record_.steady_images_per_second.value_or(record_.images_per_second);
  if (const auto utilisation = flops.at(samples_per_second)) {
    record_.model_flops_per_step = utilisation->model_flops_per_step;
    record_.tflops = utilisation->tflops;
    record_.mfu = utilisation->mfu;
  }
  if (flops.peak()) {
    record_.peak_tflops = flops.peak()->flops_per_second / 1e12;
    record_.peak_tflops_basis = flops.peak()->basis;
  }
  if (facts.seq_len > 0) {  // a sequence counts as an image above; these count its tokens
    record_.seq_len = facts.seq_len;
    record_.tokens_per_second = record_.images_per_second * static_cast<double>(*record_.seq_len);
    if (record_.steady_images_per_second)
      record_.steady_tokens_per_second = *record_.steady_images_per_second * static_cast<double>(*record_.seq_len);
  }
}

// Peaks of host, allocator and device memory, and the GPUs' utilisation while training.
void RunRecorder::record_memory_and_utilisation(const Facts& facts) {
  record_.host_peak_rss_bytes = metrics::host_peak_rss_bytes();
  if (facts.device.is_cpu())
    record_.peak_allocated_bytes = metrics::cpu_peak_allocated_bytes() - cpu_bytes_before_model_;
  for (const auto& device : facts.local_devices) {
    if (!device.is_cuda()) break;
    // Per GPU: the highest of this process's devices (under dp the first one, which gathers the outputs).
    const auto peak = metrics::cuda_allocator_peak(device.index());
    if (peak.allocated_bytes && (!record_.peak_allocated_bytes || *peak.allocated_bytes > *record_.peak_allocated_bytes))
      record_.peak_allocated_bytes = peak.allocated_bytes;
    if (peak.reserved_bytes && (!record_.peak_reserved_bytes || *peak.reserved_bytes > *record_.peak_reserved_bytes))
      record_.peak_reserved_bytes = peak.reserved_bytes;
  }
  if (const auto* peaks = facts.phase_peaks) {  // its resets left the allocator the last phase's peak alone
    record_.peak_allocated_bytes = std::max(record_.peak_allocated_bytes.value_or(0), peaks->highest());
    if (peaks->highest_reserved())
      record_.peak_reserved_bytes = std::max(record_.peak_reserved_bytes.value_or(0), *peaks->highest_reserved());
  }
  if (facts.gpu_stats) {
    record_.gpu_util_mean = facts.gpu_stats->util_mean;
    record_.gpu_util_peak = facts.gpu_stats->util_peak;
    record_.peak_nvml_used_bytes = facts.gpu_stats->memory_used_peak;
  }
}

// What computed the run: kernels, CUDA graphs, versions, the environment, the config and the loader.
void RunRecorder::record_implementation(const Facts& facts) {
  models::Model& model = *facts.trained_model;
  record_.channels_last = facts.channels_last;
  record_.cuda_graphs = facts.cuda_graphs;
  const bool fused_here = facts.fused_kernels && facts.fused_available;
  record_.kernels = {{"optimizer", facts.optimizer_implementation},
                     {"cross_entropy", fused_here ? "fused" : "reference"}};
  record_.fused_optimizer = facts.optimizer_implementation == "fused";
  // Only models built on ptrain's own batch norm reach its fused kernels: a TorchScript network or a
  // user's module with torch::nn norms runs LibTorch's, and a record must not say otherwise.
  if (uses_ptrain_batch_norm(model)) {
    const bool fused_norms = fused_here && facts.channels_last;
    record_.kernels["batch_norm_relu"] = fused_norms ? "fused" : "reference";
    // Whether the outputs feeding convolutions were recomputed in the backward (--relu-recompute).
    if (fused_norms) record_.kernels["relu_before_conv"] = facts.relu_recompute ? "recomputed" : "kept";
    // Where the convolutions handed their statistics to the batch norms (--conv-bn-fusion), as the last
    // training forward took it.
    const std::string conv_bn = model.describe_conv_bn_fusion();
    if (fused_norms && !conv_bn.empty()) record_.kernels["conv_bn_fusion"] = conv_bn;
  }
  // The fused paths --skip-fusions left out: a run without one is measured as such.
  const std::vector<std::string>& skipped = facts.skip_fusions;
  if (facts.fused_kernels && !skipped.empty()) {
    record_.kernels["skipped_fusions"] = join(skipped, ",");
    // A skip another path made moot measured nothing: the record says so, and so does the run's end.
    std::vector<std::string> without_effect;
    for (const auto& bypassed : model.fusions_bypassed())
      if (std::count(skipped.begin(), skipped.end(), bypassed)) without_effect.push_back(bypassed);
    if (!without_effect.empty()) {
      record_.kernels["skipped_fusions_without_effect"] = join(without_effect, ",");
      if (facts.warns)
        std::cerr << "ptrain: warning: --skip-fusions " << join(without_effect, ",")
                  << " had no effect: the last training forward ran another path in its place (kernels.conv_bn_fusion: "
                  << model.describe_conv_bn_fusion() << ")" << std::endl;
    }
  }
  // Which form of the ImageNet stem's convolution the last training forward ran (ResNets only).
  if (const std::string stem = model.describe_stem_conv(); !stem.empty()) record_.kernels["stem_conv"] = stem;
  record_.step_phase_seconds = facts.step_phase_seconds;
  record_.ptrain_version = PTRAIN_VERSION;
  record_.torch_version = compat::torch_version();
  record_.environment = metrics::describe_environment(facts.device);
  record_.extra["config"] = facts.config;
  record_.diverged_at_step = facts.diverged_at_step;
  // How long the training step waited for its batches (host time in the loader's next()): a loader that
  // cannot keep up shows here. Documented in docs/metrics.md.
  const double train_seconds = facts.clock->train_seconds();
  const double wait_seconds = facts.loader_wait_seconds;
  record_.extra["data_loader"] = {{"image_loading", facts.streamed_data ? "stream" : "memory"},
                                  {"threads", facts.loader_threads},
                                  {"wait_seconds", wait_seconds},
                                  {"wait_fraction", train_seconds > 0 ? wait_seconds / train_seconds : 0.0}};
}

}  // namespace ptrain::train
