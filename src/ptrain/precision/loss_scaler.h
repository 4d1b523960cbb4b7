// Dynamic loss scaling with the rules of torch.amp.GradScaler, plus DeepSpeed's hysteresis.
//
// All state (scale, growth tracker, hysteresis counter, found_inf) lives in tensors on the training
// device, and scale/unscale_/update never read a value back to the host: the whole step can be
// captured in a CUDA graph, and the optimizer skips its update by reading found_inf() on the device.
//
// Per step: loss_scaler.scale(loss).backward(); unscale_(grads); optimizer step unless found_inf; update().
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

namespace ptrain::precision {

struct PrecisionPolicy;

struct LossScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int64_t hysteresis = 1;  // DeepSpeed: overflows tolerated before backing off; 1 = GradScaler
  // DeepSpeed's consecutive_hysteresis: true refills the tolerance after any clean step (so only
  // `hysteresis` overflows in a row back off); false refills it only when the scale grows (DeepSpeed's
  // default: `hysteresis` overflows within one growth interval back off).
  bool consecutive_hysteresis = true;
  double min_scale = 0.0;  // the scale never backs off below this (0: no floor, as GradScaler)
  bool dynamic = true;     // false: static scale, never changes (found_inf is still computed)
  bool enabled = true;     // false: scale() is the identity, unscale_/update do nothing
};

// The options --precision/--loss-scale asked for: disabled when the policy has no loss scaling,
// static with the given scale, or dynamic with the policy's rules (GradScaler's by default).
LossScalerOptions loss_scaler_options(const PrecisionPolicy& policy);

class LossScaler {
 public:
  LossScaler(LossScalerOptions options, torch::Device device);

  // loss * scale, promoted like GradScaler.scale (a half loss comes back as float32).
  torch::Tensor scale(const torch::Tensor& loss) const;

  // Multiplies every defined gradient by 1/scale in place and records in found_inf() whether any
  // gradient had an inf or NaN. Idempotent within a step: a second call before update() does nothing.
  void unscale_(const std::vector<torch::Tensor>& grads);

  // float32 0-dim tensor on the device: 1 when the last unscale_ saw a non-finite gradient, else 0.
  const torch::Tensor& found_inf() const { return found_inf_; }

  // Scale update as torch._amp_update_scale_ (back off on overflow, grow after growth_interval clean
  // steps), with hysteresis and min_scale. Ends the step: the next unscale_ works again.
  // Throws ptrain::Error when called in a step without unscale_ (GradScaler refuses likewise).
  void update();

  torch::Tensor scale_tensor() const { return scale_; }
  double current_scale() const;  // reads the device: for logs only
  const LossScalerOptions& options() const { return options_; }

  // The tensors that make the scaler resumable, by name ("scale", "growth_tracker",
  // "hysteresis_remaining"); load_state checks names and shapes and moves them to the device.
  std::vector<std::pair<std::string, torch::Tensor>> state() const;
  void load_state(const std::vector<std::pair<std::string, torch::Tensor>>& state);

 private:
  void update_with_tensor_ops(const torch::Tensor& overflow);

  LossScalerOptions options_;
  torch::Device device_;
  torch::Tensor scale_;                 // float32, 0-dim
  torch::Tensor growth_tracker_;        // int32, 0-dim: consecutive clean steps since the last change
  torch::Tensor hysteresis_remaining_;  // int32, 0-dim: overflows still tolerated before backing off
  torch::Tensor found_inf_;             // float32, 0-dim
  bool unscaled_this_step_ = false;
};

}  // namespace ptrain::precision
