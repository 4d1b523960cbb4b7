#include "ptrain/train/run/step_engine.h"

#include <map>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include "ptrain/core/error.h"
#include "ptrain/core/profiler_range.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/kernels/cross_entropy.h"
#include "ptrain/models/state_dict.h"
#include "ptrain/precision/autocast_guard.h"
#include "ptrain/train/grad_clip.h"

namespace ptrain::train {

namespace {

// PyTorch's names for an optimizer's calls on the profiler's timeline ("Optimizer.step#SGD.step"), which
// TensorBoard's profile plugin and trace tools look for.
std::string optimizer_range(OptimizerKind optimizer, const std::string& call) {
  const std::string type = optimizer == OptimizerKind::adamw ? "AdamW" : "SGD";
  return "Optimizer." + call + "#" + type + "." + call;
}

}  // namespace

StepEngine::StepEngine(Options options, strategies::Strategy& strategy, metrics::StepPhaseTimer& phases,
                       metrics::PhasePeaks* phase_peaks, std::shared_ptr<models::Model> model,
                       std::unique_ptr<strategies::UpdateTarget> target, std::unique_ptr<Optimizer> optimizer,
                       std::unique_ptr<LrSchedule> schedule)
    : options_(std::move(options)), strategy_(strategy), phases_(phases), phase_peaks_(phase_peaks),
      model_(std::move(model)), target_(std::move(target)), optimizer_(std::move(optimizer)),
      schedule_(std::move(schedule)) {
  const torch::Device& device = options_.device;
  if (options_.policy.loss_scaling) scaler_.emplace(precision::loss_scaler_options(options_.policy), device);
  totals_ = std::make_unique<RunningTotals>(device);
  step_loss_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device));
}

void StepEngine::watch_divergence(int64_t first_step) {
  divergence_ = std::make_unique<DivergenceWatch>(options_.device, first_step, scaler_ ? &*scaler_ : nullptr);
}

void StepEngine::keep_grad_norm() {
  if (options_.clip_grad_norm > 0)
    last_grad_norm_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(options_.device));
}

std::string StepEngine::capture_obstacle() const {
  if (!options_.cuda_graphs) return "off (--no-cuda-graphs)";
  if (options_.on_step_memory) return "off: the step's memory is read phase by phase (ptrain estimate's probes)";
  if (!options_.device.is_cuda()) return "off (CUDA graphs need a CUDA device)";
  const std::string strategy = strategy_.capture_obstacle();
  if (!strategy.empty()) return "off: " + strategy;
  if (!optimizer_->capturable()) {
    return "off: the " + optimizer_name(options_.optimizer) +
           " step runs LibTorch's foreach ops, which take the learning rate from the host (" +
           (options_.fused_kernels ? "this LibTorch has no fused optimizer kernels" : "--no-fused-kernels") + ")";
  }
  return "";
}

void StepEngine::make_runner(std::unique_ptr<CapturedStep> graph) {
  runner_ = std::make_unique<StepRunner>(std::move(graph), phases_,
                                         [this](const StepRunner::Batches& images, const StepRunner::Batches& labels) {
                                           device_step(images, labels);
                                         });
}

void StepEngine::step(int64_t step, const std::vector<torch::Tensor>& images,
                      const std::vector<torch::Tensor>& labels) {
  step_ = step;
  optimizer_->set_learning_rate(schedule_->lr(step));
  // The shorter last window of an epoch runs eagerly: a captured step replays accum micro-batches.
  if (static_cast<int64_t>(images.size()) < options_.grad_accum) {
    runner_->run_eagerly(images, labels);
  } else {
    runner_->run(images, labels);
  }
}

// Unscale, clip, update: everything after the last micro-batch's backward, at the rate set on the optimizer
// before the step. Returns nothing to the host.
torch::Tensor StepEngine::optimizer_step() {
  using metrics::StepPhase;
  phases_.begin(StepPhase::kCommunication);
  strategy_.finish_backward();
  target_->gradients_ready();
  phases_.end(StepPhase::kCommunication);
  phases_.begin(StepPhase::kOptimizer);
  std::vector<torch::Tensor> grads;
  for (const auto& p : optimizer_->params()) grads.push_back(p.grad());
  if (scaler_) {
    scaler_->unscale_(grads);
    target_->agree_found_inf(scaler_->found_inf());
  }
  torch::Tensor grad_norm;
  if (options_.clip_grad_norm > 0) {
    // A rank may hold a shard of the gradients: the norm that clips is the one over all of them.
    grad_norm = target_->global_norm(global_grad_norm(grads));
    clip_grads_to_norm_(grads, grad_norm, options_.clip_grad_norm);
  }
  {
    const compat::ProfilerRange range(optimizer_range(options_.optimizer, "step"));
    optimizer_->step_at_set_rate(scaler_ ? &scaler_->found_inf() : nullptr);
  }
  phases_.end(StepPhase::kOptimizer);
  phases_.begin(StepPhase::kCommunication);
  target_->parameters_updated();
  phases_.end(StepPhase::kCommunication);
  phases_.begin(StepPhase::kOptimizer);
  divergence_->end_step();
  if (scaler_) scaler_->update();
  {
    const compat::ProfilerRange range(optimizer_range(options_.optimizer, "zero_grad"));
    optimizer_->zero_grad();
  }
  phases_.end(StepPhase::kOptimizer);
  return grad_norm;
}

void StepEngine::device_step(const std::vector<torch::Tensor>& images, const std::vector<torch::Tensor>& labels) {
  using metrics::StepPhase;
  const torch::Device& device = options_.device;
  const precision::PrecisionPolicy& policy = options_.policy;
  const auto accum = static_cast<int64_t>(images.size());
  if (phase_peaks_) phase_peaks_->take();  // what the batch's loading held belongs to no phase of the step
  for (int64_t micro = 0; micro < accum; ++micro) {
    strategy_.set_gradient_sync(micro == accum - 1);
    phases_.begin(StepPhase::kForward);
    torch::Tensor logits;
    {
      precision::AutocastGuard autocast(device.type(), policy.autocast, policy.autocast_dtype);
      logits = strategy_.forward(*model_, images[micro]);
    }
    const auto predictions = prediction_logits(logits);
    const auto targets = prediction_labels(labels[micro]);
    auto [loss, correct] = kernels::cross_entropy(predictions, targets, kernels::Reduction::kMean,
                                                  options_.fused_kernels, options_.classes);
    divergence_->observe_loss(loss);
    if (options_.report_step_loss) {
      torch::NoGradGuard no_grad;
      if (micro == 0) step_loss_.zero_();
      step_loss_.add_(loss.detach());
    }
    auto scaled = accum > 1 ? loss / static_cast<double>(accum) : loss;
    {
      // Loss and accuracy are per prediction: n of them, or n x T for tokens.
      torch::NoGradGuard no_grad;
      const auto predicted = static_cast<double>(targets.size(0));
      auto batch_loss = loss.detach().to(torch::kDouble) * predicted;
      totals_->loss_sum.add_(batch_loss);
      totals_->window_loss.add_(batch_loss);
      totals_->correct.add_(correct);
      totals_->samples.add_(predicted);
    }
    phases_.end(StepPhase::kForward);
    phases_.begin(StepPhase::kBackward);
    (scaler_ ? scaler_->scale(scaled) : scaled).backward();
    phases_.end(StepPhase::kBackward);
  }
  const int64_t forward_backward_bytes = phase_peaks_ ? phase_peaks_->take() : 0;
  const torch::Tensor grad_norm = optimizer_step();
  if (phase_peaks_) options_.on_step_memory(step_ + 1, forward_backward_bytes, phase_peaks_->take());
  if (last_grad_norm_.defined() && grad_norm.defined()) last_grad_norm_.copy_(grad_norm);
}

RunningTotals StepEngine::reduced_totals() const {
  RunningTotals sum(options_.device);
  sum.loss_sum.copy_(totals_->loss_sum);
  sum.correct.copy_(totals_->correct);
  sum.samples.copy_(totals_->samples);
  strategy_.all_reduce_sum(sum.loss_sum);
  strategy_.all_reduce_sum(sum.correct);
  strategy_.all_reduce_sum(sum.samples);
  return sum;
}

std::optional<StepEngine::Divergence> StepEngine::read_divergence(int64_t step) const {
  const auto status = divergence_->read([&](torch::Tensor& t) { strategy_.all_reduce_sum(t); });
  if (!status.diverged()) return std::nullopt;
  return Divergence{divergence_->describe(status, step), status.first_step.value_or(step)};
}

Evaluation StepEngine::evaluate(data::Loader& test_loader) {
  torch::NoGradGuard no_grad;
  const torch::Device& device = options_.device;
  const precision::PrecisionPolicy& policy = options_.policy;
  // Each rank evaluates its share of the test split: all with rank 0's statistics, which checkpoints keep.
  strategy_.sync_buffers();
  model_->eval();
  test_loader.start_epoch(0);
  auto options = torch::TensorOptions().dtype(torch::kDouble).device(device);
  auto loss_sum = torch::zeros({}, options), correct = torch::zeros({}, options);
  int64_t seen = 0;
  while (auto batch = test_loader.next()) {
    torch::Tensor logits;
    {
      precision::AutocastGuard autocast(device.type(), policy.autocast, policy.autocast_dtype);
      logits = strategy_.forward(*model_, batch->images);
    }
    const auto predictions = prediction_logits(logits);
    const auto labels = prediction_labels(batch->labels);
    const auto [batch_loss, batch_correct] = kernels::cross_entropy(predictions, labels, kernels::Reduction::kSum,
                                                                    options_.fused_kernels, options_.classes);
    loss_sum.add_(batch_loss);
    correct.add_(batch_correct);
    seen += labels.size(0);
  }
  model_->train();
  strategy_.all_reduce_sum(loss_sum);
  strategy_.all_reduce_sum(correct);
  const double total = static_cast<double>(seen * strategy_.world_size());
  return {loss_sum.item<double>() / total, correct.item<double>() / total};
}

std::optional<double> StepEngine::loss_scale() const {
  return scaler_ ? std::optional<double>(scaler_->current_scale()) : std::nullopt;
}

std::optional<double> StepEngine::grad_norm() const {
  return last_grad_norm_.defined() ? std::optional<double>(last_grad_norm_.item<double>()) : std::nullopt;
}

io::NamedTensors StepEngine::model_state() { return models::state_dict(*model_); }

io::NamedTensors StepEngine::full_parameters() { return target_->full_parameters(); }

io::NamedTensors StepEngine::full_optimizer_state() { return target_->full_optimizer_state(optimizer_->state()); }

io::NamedTensors StepEngine::local_shards(nlohmann::json* layout) {
  return target_->local_shards(optimizer_->state(), layout);
}

io::NamedTensors StepEngine::scaler_state() { return scaler_ ? scaler_->state() : io::NamedTensors{}; }

io::NamedTensors StepEngine::progress_totals() { return reduced_totals().named(); }

bool StepEngine::finite() {
  torch::NoGradGuard no_grad;
  auto bad = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(options_.device));
  std::map<std::pair<c10::DeviceIndex, c10::ScalarType>, std::vector<torch::Tensor>> fused;  // the kernel's groups
  const auto count = [&](const torch::Tensor& t) {
    if (!t.defined() || !t.is_floating_point() || t.numel() == 0) return;
    // On a GPU, one fused GradScaler launch per dtype (with a scale of 1, which leaves every value as it is)
    // instead of nine small kernels a tensor: before every save, those left the GPU idle about 33 ms of GPT-2
    // large's 2.2 s between saves (docs/results/2026-12-06-gpu-async-checkpoint.md, call 11's trace).
    if (compat::fused_unscale_supports(t.device(), t.scalar_type()) && t.is_non_overlapping_and_dense()) {
      fused[{t.device().index(), t.scalar_type()}].push_back(t);
      return;
    }
    bad.add_(torch::logical_not(torch::isfinite(t)).sum().to(bad.device()));
  };
  for (const auto& p : optimizer_->params()) count(p);
  for (const auto& b : model_->buffers()) count(b);
  for (auto& [where, group] : fused) {
    const auto on_device = torch::TensorOptions().dtype(torch::kFloat).device(group.front().device());
    auto found_inf = torch::zeros({1}, on_device);
    at::_amp_foreach_non_finite_check_and_unscale_(group, found_inf, torch::ones({1}, on_device));
    bad.add_(found_inf.sum().to(bad.device(), torch::kDouble));
  }
  strategy_.all_reduce_sum(bad);
  return bad.item<double>() == 0;
}

void StepEngine::load(const Checkpoint& checkpoint, const std::string& source) {
  load_model_state(checkpoint.model, source);
  optimizer_->load_state(target_->local_optimizer_state(checkpoint.optimizer), source);
  if (scaler_) scaler_->load_state(checkpoint.scaler);
  // The saved totals are summed over the ranks of the run that saved them: one rank carries them on.
  if (strategy_.rank() == 0) totals_->load(checkpoint.progress);
}

void StepEngine::load_model_state(const io::NamedTensors& saved, const std::string& source) {
  target_->load_full_parameters(saved, source);
  std::map<std::string, torch::Tensor> by_name(saved.begin(), saved.end());
  torch::NoGradGuard no_grad;
  for (const auto& item : model_->named_buffers()) {
    auto it = by_name.find(item.key());
    check(it != by_name.end(), source + ": buffer '" + item.key() + "' is missing");
    check(it->second.sizes() == item.value().sizes(), source + ": buffer '" + item.key() + "' has shape " +
                                                          c10::str(it->second.sizes()) + ", expected " +
                                                          c10::str(item.value().sizes()));
    item.value().copy_(it->second);
  }
}

}  // namespace ptrain::train
