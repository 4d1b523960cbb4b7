#include "ptrain/precision/loss_scaler.h"

#include <cmath>
#include <map>

#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/precision/policy.h"

namespace ptrain::precision {
namespace {

void check_options(const LossScalerOptions& o) {
  check(std::isfinite(o.init_scale) && o.init_scale > 0.0,
        "--loss-scale: the initial loss scale must be positive and finite, got " + std::to_string(o.init_scale));
  check(o.growth_factor > 1.0, "loss scaler: growth_factor must be > 1, got " + std::to_string(o.growth_factor));
  check(o.backoff_factor > 0.0 && o.backoff_factor < 1.0,
        "loss scaler: backoff_factor must be in (0, 1), got " + std::to_string(o.backoff_factor));
  check(o.growth_interval >= 1,
        "loss scaler: growth_interval must be >= 1, got " + std::to_string(o.growth_interval));
  check(o.hysteresis >= 1, "loss scaler: hysteresis must be >= 1, got " + std::to_string(o.hysteresis));
  check(o.min_scale >= 0.0 && o.min_scale <= o.init_scale,
        "loss scaler: min_scale must be in [0, init_scale], got " + std::to_string(o.min_scale));
}

torch::Tensor scalar_on(torch::Device device, double value, torch::ScalarType dtype) {
  return torch::full({}, value, torch::TensorOptions().dtype(dtype).device(device));
}

}  // namespace

LossScalerOptions loss_scaler_options(const PrecisionPolicy& policy) {
  LossScalerOptions o;
  o.enabled = policy.loss_scaling;
  o.dynamic = policy.dynamic_loss_scale;
  if (policy.static_loss_scale) {
    o.init_scale = *policy.static_loss_scale;
    return o;
  }
  o.init_scale = policy.initial_loss_scale;
  o.growth_interval = policy.loss_scale_window;
  o.hysteresis = policy.hysteresis;
  o.consecutive_hysteresis = policy.consecutive_hysteresis;
  o.min_scale = policy.min_loss_scale;
  return o;
}

LossScaler::LossScaler(LossScalerOptions options, torch::Device device)
    : options_(options), device_(device) {
  check_options(options_);
  scale_ = scalar_on(device_, options_.init_scale, torch::kFloat);
  device_ = scale_.device();  // "cuda" becomes "cuda:N", which gradients report
  growth_tracker_ = scalar_on(device_, 0, torch::kInt);
  hysteresis_remaining_ = scalar_on(device_, static_cast<double>(options_.hysteresis), torch::kInt);
  found_inf_ = scalar_on(device_, 0, torch::kFloat);
}

torch::Tensor LossScaler::scale(const torch::Tensor& loss) const {
  if (!options_.enabled) return loss;
  return loss * scale_.to(loss.device(), /*non_blocking=*/true);
}

void LossScaler::unscale_(const std::vector<torch::Tensor>& grads) {
  if (!options_.enabled || unscaled_this_step_) return;
  unscaled_this_step_ = true;
  found_inf_.zero_();
  // GradScaler computes the reciprocal in double: for a non-power-of-two static scale this is the
  // float nearest to 1/scale, not the reciprocal of an already rounded float.
  const torch::Tensor inv_scale = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat);

  std::map<c10::ScalarType, std::vector<torch::Tensor>> by_dtype;
  for (const auto& g : grads) {
    if (!g.defined()) continue;
    check(g.device() == device_, "loss scaler: a gradient is on " + g.device().str() + " but the scaler on " +
                                     device_.str());
    check(!g.is_sparse(), "loss scaler: sparse gradients are not supported");
    by_dtype[g.scalar_type()].push_back(g);
  }
  std::vector<torch::Tensor> nonfinite_flags;
  for (auto& [dtype, group] : by_dtype) {
    if (compat::fused_unscale_supports(device_, dtype)) {
      // One fused launch per dtype: the kernel's fast path needs all tensors of one dtype.
      at::_amp_foreach_non_finite_check_and_unscale_(group, found_inf_, inv_scale);
      continue;
    }
    // CPU and bfloat16 on CUDA (see compat::fused_unscale_supports): the
    // same result with plain tensor ops, still without reading anything back to the host. The check
    // precedes the multiplication, as in the kernel.
    for (auto& g : group) {
      nonfinite_flags.push_back(torch::logical_not(torch::isfinite(g)).any());
      g.mul_(inv_scale);
    }
  }
  if (!nonfinite_flags.empty()) {
    found_inf_.copy_(torch::maximum(found_inf_, torch::stack(nonfinite_flags).any().to(torch::kFloat)));
  }
}

void LossScaler::update() {
  if (!options_.enabled) return;
  check(unscaled_this_step_,
        "loss scaler: update() called without unscale_() in this step; found_inf would be stale");
  unscaled_this_step_ = false;
  if (!options_.dynamic) return;
  const bool plain_gradscaler = options_.hysteresis == 1 && options_.min_scale == 0.0;
  if (compat::fused_scale_update_supports(device_) && plain_gradscaler) {
    at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor, options_.backoff_factor,
                           options_.growth_interval);
    return;
  }
  update_with_tensor_ops(found_inf_ > 0);
}

// The rules of _amp_update_scale_'s kernel, written as device-side selects:
//   overflow: scale *= backoff (but not below min_scale), tracker = 0;
//   clean:    tracker += 1; when it reaches growth_interval, scale *= growth (only if the result is
//             finite in float32) and tracker = 0.
// Hysteresis (DeepSpeed's DynamicLossScaler): an overflow with more than one tolerated overflow left
// only decrements the counter (the step is still skipped, the tracker still resets); a clean step
// refills it (consecutive_hysteresis), or only a step that grows the scale (DeepSpeed's default).
// An overflow at min_scale skips the step and leaves the scale at the floor; that it happened is noticed
// by train/divergence.h, which stops the run where the host reads the device anyway (DeepSpeed stops
// at once, which would need a host read in every step).
void LossScaler::update_with_tensor_ops(const torch::Tensor& overflow) {
  const torch::Tensor back_off = overflow & (hysteresis_remaining_ <= 1);
  const torch::Tensor tracker_next = growth_tracker_ + 1;
  // Products in double, rounded once to float32, as the CUDA kernel computes them.
  const torch::Tensor scale64 = scale_.to(torch::kDouble);
  const torch::Tensor grown = (scale64 * options_.growth_factor).to(torch::kFloat);
  const torch::Tensor grow = torch::logical_not(overflow) & (tracker_next == options_.growth_interval);

  torch::Tensor backed_off = (scale64 * options_.backoff_factor).to(torch::kFloat);
  if (options_.min_scale > 0.0) backed_off = torch::clamp_min(backed_off, options_.min_scale);
  const torch::Tensor new_scale =
      torch::where(back_off, backed_off, torch::where(grow & torch::isfinite(grown), grown, scale_));
  const torch::Tensor new_tracker = torch::where(overflow | grow, torch::zeros_like(tracker_next), tracker_next);
  const torch::Tensor refilled = torch::full_like(hysteresis_remaining_, options_.hysteresis);
  const torch::Tensor kept_or_refilled =
      options_.consecutive_hysteresis ? refilled : torch::where(grow, refilled, hysteresis_remaining_);
  const torch::Tensor new_hysteresis =
      torch::where(overflow, torch::clamp_min(hysteresis_remaining_ - 1, 1), kept_or_refilled);

  scale_.copy_(new_scale);
  growth_tracker_.copy_(new_tracker);
  hysteresis_remaining_.copy_(new_hysteresis);
}

double LossScaler::current_scale() const { return scale_.item<double>(); }

std::vector<std::pair<std::string, torch::Tensor>> LossScaler::state() const {
  return {{"scale", scale_.clone()},
          {"growth_tracker", growth_tracker_.clone()},
          {"hysteresis_remaining", hysteresis_remaining_.clone()}};
}

void LossScaler::load_state(const std::vector<std::pair<std::string, torch::Tensor>>& state) {
  std::map<std::string, torch::Tensor*> targets{{"scale", &scale_},
                                                {"growth_tracker", &growth_tracker_},
                                                {"hysteresis_remaining", &hysteresis_remaining_}};
  std::map<std::string, torch::Tensor> loaded;
  for (const auto& [name, tensor] : state) {
    check(targets.count(name) == 1, "loss scaler state: unknown entry '" + name + "'");
    check(tensor.defined() && tensor.numel() == 1,
          "loss scaler state: entry '" + name + "' must hold exactly one value");
    loaded[name] = tensor;
  }
  for (const auto& [name, target] : targets) {
    check(loaded.count(name) == 1, "loss scaler state: entry '" + name + "' is missing");
  }
  const double scale_value = loaded["scale"].item<double>();
  check(std::isfinite(scale_value) && scale_value > 0.0,
        "loss scaler state: entry 'scale' must be positive and finite, got " + std::to_string(scale_value));
  for (const auto& [name, target] : targets) {
    target->copy_(loaded[name].reshape({}).to(target->device(), target->scalar_type()));
  }
  unscaled_this_step_ = false;
}

}  // namespace ptrain::precision
