// One optimizer step: the micro-batches' forward and backward, then unscale, clip and update (what
// step_runner.h runs eagerly or captures as a CUDA graph), whether it can be captured, and the step phases'
// timing.
#include <iostream>

#include "ptrain/core/torch_compat.h"
#include "ptrain/kernels/cross_entropy.h"
#include "ptrain/metrics/memory.h"
#include "ptrain/precision/autocast_guard.h"
#include "ptrain/train/grad_clip.h"
#include "ptrain/train/training_run.h"

namespace ptrain::train {

namespace {

// PyTorch's names for an optimizer's calls on the profiler's timeline ("Optimizer.step#SGD.step"), which
// TensorBoard's profile plugin and trace tools look for.
std::string optimizer_range(const std::string& optimizer, const std::string& call) {
  const std::string type = optimizer == "sgd" ? "SGD" : optimizer == "adamw" ? "AdamW" : optimizer;
  return "Optimizer." + call + "#" + type + "." + call;
}

}  // namespace

// Unscale, clip, update: everything after the last micro-batch's backward, at the rate set on the optimizer
// before the step. Returns nothing to the host.
torch::Tensor TrainingRun::optimizer_step() {
  using metrics::StepPhase;
  phases_.begin(StepPhase::kCommunication);
  strategy_->finish_backward();
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
  if (c_.optim.clip_grad_norm > 0) {
    // A rank may hold a shard of the gradients: the norm that clips is the one over all of them.
    grad_norm = target_->global_norm(global_grad_norm(grads));
    clip_grads_to_norm_(grads, grad_norm, c_.optim.clip_grad_norm);
  }
  {
    const compat::ProfilerRange range(optimizer_range(c_.optim.name, "step"));
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
    const compat::ProfilerRange range(optimizer_range(c_.optim.name, "zero_grad"));
    optimizer_->zero_grad();
  }
  phases_.end(StepPhase::kOptimizer);
  return grad_norm;
}

void TrainingRun::device_step(const std::vector<torch::Tensor>& images, const std::vector<torch::Tensor>& labels) {
  using metrics::StepPhase;
  const auto accum = static_cast<int64_t>(images.size());
  if (phase_peaks_) phase_peaks_->take();  // what the batch's loading held belongs to no phase of the step
  for (int64_t micro = 0; micro < accum; ++micro) {
    strategy_->set_gradient_sync(micro == accum - 1);
    phases_.begin(StepPhase::kForward);
    torch::Tensor logits;
    {
      precision::AutocastGuard autocast(device_.type(), policy_.autocast, policy_.autocast_dtype);
      logits = strategy_->forward(*model_, images[micro]);
    }
    const auto predictions = prediction_logits(logits);
    const auto targets = prediction_labels(labels[micro]);
    auto [loss, correct] =
        kernels::cross_entropy(predictions, targets, kernels::Reduction::kMean, c_.run.fused_kernels, classes_);
    divergence_->observe_loss(loss);
    if (hooks_.on_step) {
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
  if (phase_peaks_) hooks_.on_step_memory({global_step_ + 1, forward_backward_bytes, phase_peaks_->take()});
  if (last_grad_norm_.defined() && grad_norm.defined()) last_grad_norm_.copy_(grad_norm);
}

std::string TrainingRun::capture_obstacle() const {
  if (!c_.run.cuda_graphs) return "off (--no-cuda-graphs)";
  if (hooks_.on_step_memory) return "off: the step's memory is read phase by phase (ptrain estimate's probes)";
  if (!device_.is_cuda()) return "off (CUDA graphs need a CUDA device)";
  const std::string strategy = strategy_->capture_obstacle();
  if (!strategy.empty()) return "off: " + strategy;
  if (!optimizer_->capturable()) {
    return "off: the " + c_.optim.name + " step runs LibTorch's foreach ops, which take the learning rate from the host (" +
           (c_.run.fused_kernels ? "this LibTorch has no fused optimizer kernels" : "--no-fused-kernels") + ")";
  }
  return "";
}

void TrainingRun::collect_step_phases() {
  phases_.collect();
  phases_.add_replayed_steps(steps_->take_replays());
}

}  // namespace ptrain::train
