// The run's optimizer steps and what they change: the model, what the optimizer updates on this rank (the
// strategy's update target), the optimizer, the loss scaler and the learning-rate schedule, the step runner
// (eager steps, then a captured CUDA graph), the epoch's running totals on the device, the divergence watch,
// and the step's loss and gradient norm where something reads them. The loop hands it each step's batches and
// global step; what checkpoints need of it, it gives as named states.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "ptrain/data/loader.h"
#include "ptrain/io/named_tensors.h"
#include "ptrain/metrics/memory.h"
#include "ptrain/metrics/step_phases.h"
#include "ptrain/models/model.h"
#include "ptrain/precision/loss_scaler.h"
#include "ptrain/precision/policy.h"
#include "ptrain/strategies/strategy.h"
#include "ptrain/train/captured_step.h"
#include "ptrain/train/checkpoint.h"
#include "ptrain/train/divergence.h"
#include "ptrain/train/optimizer.h"
#include "ptrain/train/schedule.h"
#include "ptrain/train/step_runner.h"

namespace ptrain::train {

// Sums kept on the device during an epoch; read back only when progress is shown. A captured step adds
// into these very tensors at every replay, so they are reset in place, never replaced.
struct RunningTotals {
  torch::Tensor loss_sum, correct, samples;
  torch::Tensor window_loss;  // the loss sum since the last progress line

  explicit RunningTotals(const torch::Device& device) {
    auto options = torch::TensorOptions().dtype(torch::kDouble).device(device);
    loss_sum = torch::zeros({}, options);
    correct = torch::zeros({}, options);
    samples = torch::zeros({}, options);
    window_loss = torch::zeros({}, options);
  }
  void reset() {
    loss_sum.zero_();
    correct.zero_();
    samples.zero_();
    window_loss.zero_();
  }
  io::NamedTensors named() const { return {{"loss_sum", loss_sum}, {"correct", correct}, {"samples", samples}}; }
  void load(const io::NamedTensors& saved) {
    for (const auto& [name, value] : saved) {
      if (name == "loss_sum") loss_sum.copy_(value);
      if (name == "correct") correct.copy_(value);
      if (name == "samples") samples.copy_(value);
    }
  }
};

struct Evaluation {
  double loss = 0, accuracy = 0;
};

// Image models give logits [B, classes] for labels [B]; language models [B, T, vocab] for labels [B, T], every
// position a prediction of its next token. Both flatten to [predictions, classes] and [predictions].
inline torch::Tensor prediction_logits(const torch::Tensor& logits) {
  return logits.dim() > 2 ? logits.flatten(0, -2) : logits;
}
inline torch::Tensor prediction_labels(const torch::Tensor& labels) {
  return labels.dim() > 1 ? labels.flatten() : labels;
}

class StepEngine {
 public:
  struct Options {
    torch::Device device = torch::kCPU;
    precision::PrecisionPolicy policy;
    int64_t grad_accum = 1;
    double clip_grad_norm = 0;   // 0: no clipping, and no norm computed
    OptimizerKind optimizer = OptimizerKind::sgd;
    bool fused_kernels = false;
    bool cuda_graphs = true;     // --cuda-graphs: whether steps may be captured at all
    int64_t classes = 0;         // the model's classes: its logits may be wider (a padded vocabulary)
    bool report_step_loss = false;  // the library's on_step hook reads each step's loss
    // The step's memory phase by phase (ptrain estimate's probes): the step, then the peaks of its forward and
    // backward passes and of its update. Set, it keeps every step eager.
    std::function<void(int64_t step, int64_t forward_backward_bytes, int64_t update_bytes)> on_step_memory;
  };
  struct Divergence {
    std::string what;
    int64_t first_step = 0;
  };

  // phases and phase_peaks (null without on_step_memory) are the monitor's: the step reports into them.
  StepEngine(Options options, strategies::Strategy& strategy, metrics::StepPhaseTimer& phases,
             metrics::PhasePeaks* phase_peaks, std::shared_ptr<models::Model> model,
             std::unique_ptr<strategies::UpdateTarget> target, std::unique_ptr<Optimizer> optimizer,
             std::unique_ptr<LrSchedule> schedule);
  StepEngine(const StepEngine&) = delete;
  StepEngine& operator=(const StepEngine&) = delete;

  models::Model& model() { return *model_; }
  const Optimizer& optimizer() const { return *optimizer_; }

  // Once the run knows the step it starts after (a resumed run's global step).
  void watch_divergence(int64_t first_step);
  // Keeps the norm clipping computes anyway, for the scalar logs; nothing without clipping.
  void keep_grad_norm();

  // Why these steps cannot be captured as a CUDA graph, or "" when they can.
  std::string capture_obstacle() const;
  // The step runner, with the captured graph the run may replay (none: every step eager).
  void make_runner(std::unique_ptr<CapturedStep> graph);
  StepRunner& runner() { return *runner_; }
  bool captured() const { return runner_ && runner_->captured(); }
  // Nothing is replayed after the last step: the graph's pool goes back before the final evaluation.
  void release_graph() {
    if (runner_) runner_->release_graph();
  }

  // Optimizer step `step` (0-based: the global steps done before it) over its micro-batches, at the
  // schedule's rate. A window shorter than --grad-accum (an epoch's last) runs eagerly.
  void step(int64_t step, const std::vector<torch::Tensor>& images, const std::vector<torch::Tensor>& labels);
  // The last step's summed micro-batch losses (reading it waits for the device); with report_step_loss only.
  double step_loss() const { return step_loss_.item<double>(); }

  RunningTotals& totals() { return *totals_; }
  // The epoch's running totals summed over the ranks (a collective: every rank calls it).
  RunningTotals reduced_totals() const;
  // Reads the divergence watch at `step` (collective); what diverged, if anything did.
  std::optional<Divergence> read_divergence(int64_t step) const;

  // The test split, each rank its share, with rank 0's buffers. Collective.
  Evaluation evaluate(data::Loader& test_loader);

  // What a progress read logs of the step: the rate of step `step` (0-based), the loss scale, the norm.
  double lr(int64_t step) const { return schedule_->lr(step); }
  std::optional<double> loss_scale() const;
  std::optional<double> grad_norm() const;

  // The named states of a checkpoint (run/run_checkpoints.h), collective where the strategy shards them.
  io::NamedTensors model_state();
  io::NamedTensors full_parameters();
  io::NamedTensors full_optimizer_state();
  io::NamedTensors optimizer_state() { return optimizer_->state(); }
  io::NamedTensors local_shards(nlohmann::json* layout);
  io::NamedTensors scaler_state();
  io::NamedTensors progress_totals();
  bool finite();
  void load(const Checkpoint& checkpoint, const std::string& source);

 private:
  // What a step does on the device, host-free where the strategy is: what runner_ runs, or captures.
  void device_step(const std::vector<torch::Tensor>& images, const std::vector<torch::Tensor>& labels);
  // Unscale, clip, update: everything after the last micro-batch's backward. Returns the norm, if computed.
  torch::Tensor optimizer_step();
  // The checkpoint holds every parameter whole and the buffers: parameters go through the update target,
  // which owns their shards and masters; buffers are copied here.
  void load_model_state(const io::NamedTensors& saved, const std::string& source);

  Options options_;
  strategies::Strategy& strategy_;
  metrics::StepPhaseTimer& phases_;
  metrics::PhasePeaks* phase_peaks_;
  std::shared_ptr<models::Model> model_;
  std::unique_ptr<strategies::UpdateTarget> target_;  // what the optimizer updates on this rank
  std::unique_ptr<Optimizer> optimizer_;
  std::optional<precision::LossScaler> scaler_;
  std::unique_ptr<LrSchedule> schedule_;
  std::unique_ptr<RunningTotals> totals_;
  std::unique_ptr<DivergenceWatch> divergence_;
  std::unique_ptr<StepRunner> runner_;  // made once the run knows whether it captures its steps
  int64_t step_ = 0;                    // the step being run: what on_step_memory reports
  torch::Tensor step_loss_;  // the step's summed micro-batch losses, for the library's on_step hook only
  torch::Tensor last_grad_norm_;  // the last step's gradient norm before clipping, when logged
};

}  // namespace ptrain::train
