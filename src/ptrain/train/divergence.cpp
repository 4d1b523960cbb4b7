#include "ptrain/train/divergence.h"

#include <cmath>
#include <cstdio>

#include "ptrain/precision/loss_scaler.h"

namespace ptrain::train {

namespace {
// float16's smallest subnormal: below it no scale can make a gradient representable.
const double kScaleFloorWithoutMinimum = std::ldexp(1.0, -24);

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", value);
  return text;
}
}  // namespace

DivergenceWatch::DivergenceWatch(const torch::Device& device, int64_t first_step, const precision::LossScaler* scaler)
    : scaler_(scaler) {
  if (scaler_ != nullptr && scaler_->options().enabled && scaler_->options().dynamic) {
    dynamic_scale_ = true;
    scale_floor_ = scaler_->options().min_scale > 0 ? scaler_->options().min_scale : kScaleFloorWithoutMinimum;
  }
  const auto on = [&](c10::ScalarType t) { return torch::TensorOptions().dtype(t).device(device); };
  nonfinite_losses_ = torch::zeros({}, on(torch::kFloat));
  step_ = torch::full({}, first_step, on(torch::kLong));
  first_bad_ = torch::full({}, -1, on(torch::kLong));
  diverged_steps_ = torch::zeros({}, on(torch::kDouble));
}

void DivergenceWatch::observe_loss(const torch::Tensor& loss) {
  torch::NoGradGuard no_grad;
  nonfinite_losses_.add_(torch::logical_not(torch::isfinite(loss.detach())).any());
}

void DivergenceWatch::end_step() {
  torch::NoGradGuard no_grad;
  step_.add_(1);
  torch::Tensor diverged;
  if (dynamic_scale_) {
    diverged = (scaler_->found_inf() > 0) & (scaler_->scale_tensor() <= scale_floor_);
  } else {
    diverged = nonfinite_losses_ > 0;
  }
  first_bad_.copy_(torch::where(diverged & (first_bad_ < 0), step_, first_bad_));
  diverged_steps_.add_(diverged);
  nonfinite_losses_.zero_();
}

DivergenceWatch::Status DivergenceWatch::read(const std::function<void(torch::Tensor&)>& sum_over_ranks) const {
  torch::Tensor total = diverged_steps_.clone();
  sum_over_ranks(total);
  Status status;
  status.diverged_steps = static_cast<int64_t>(total.item<double>());
  if (status.diverged_steps > 0) {
    const int64_t first = first_bad_.item<int64_t>();
    if (first >= 0) status.first_step = first;
  }
  return status;
}

std::string DivergenceWatch::describe(const Status& status, int64_t current_step) const {
  const std::string where = status.first_step ? "at step " + std::to_string(*status.first_step)
                                              : "on another rank, at or before step " + std::to_string(current_step);
  std::string what;
  if (dynamic_scale_) {
    what = "training diverged " + where + ": the gradients overflowed with the loss scale at its floor (" +
           number(scale_floor_) + ")";
  } else {
    what = "training diverged " + where + ": the loss is not finite";
  }
  if (status.diverged_steps > 1) what += " (" + std::to_string(status.diverged_steps) + " such steps over all ranks)";
  return what;
}

}  // namespace ptrain::train
