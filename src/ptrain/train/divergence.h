// Divergence: a run whose loss stops being finite, or whose loss scale sinks to its floor while gradients
// keep overflowing, learns nothing from then on. The watch keeps its evidence on the device, updated by
// tensor ops in the step (no host read there, so a step stays capturable as a CUDA graph), and the host
// asks only where it reads the device anyway: each progress window's loss, each epoch's end and before
// each checkpoint is saved.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <torch/torch.h>

namespace ptrain::precision {
class LossScaler;
}

namespace ptrain::train {

// What makes a step diverged:
//   no loss scaler, or a static one: a non-finite loss (a static scale skips gradient overflows, but no
//     scale cures a non-finite loss);
//   a dynamic loss scaler: an overflowing step whose scale was already at the floor (--min-loss-scale, or
//     2^-24, float16's smallest subnormal, when there is none), as DeepSpeed refuses to go on there. Its
//     other skipped steps, non-finite loss or not, are the scaler's business.
class DivergenceWatch {
 public:
  // first_step: the optimizer steps done before this run's first (a resumed run's global step).
  DivergenceWatch(const torch::Device& device, int64_t first_step, const precision::LossScaler* scaler);

  // Every micro-batch's loss, before backward.
  void observe_loss(const torch::Tensor& loss);
  // After the step's gradients are unscaled (and found_inf agreed), before the scaler's update().
  void end_step();

  struct Status {
    int64_t diverged_steps = 0;           // over every rank
    std::optional<int64_t> first_step;    // the first diverged step this rank saw (1-based global step)
    bool diverged() const { return diverged_steps > 0; }
  };
  // Reads the device. sum_over_ranks all-reduces a tensor in place (every rank must call read together).
  Status read(const std::function<void(torch::Tensor&)>& sum_over_ranks) const;

  // One line for the user: what diverged, where, and what to try.
  std::string describe(const Status& status, int64_t current_step) const;

 private:
  const precision::LossScaler* scaler_;
  bool dynamic_scale_ = false;
  double scale_floor_ = 0;
  torch::Tensor nonfinite_losses_;  // float, this step's micro-batches with a non-finite loss
  torch::Tensor step_;              // int64, the step being run (1-based)
  torch::Tensor first_bad_;         // int64, the first diverged step, -1 while none
  torch::Tensor diverged_steps_;    // double
};

}  // namespace ptrain::train
