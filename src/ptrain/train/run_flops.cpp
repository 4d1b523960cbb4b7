#include "ptrain/train/run_flops.h"

#include <cstdio>

#include "ptrain/core/cuda_runtime.h"

namespace ptrain::train {

RunFlops::RunFlops(std::optional<double> forward_flops_per_sample, std::optional<metrics::DensePeak> peak,
                   int64_t samples_per_step, int64_t devices)
    : forward_flops_per_sample_(forward_flops_per_sample),
      peak_(std::move(peak)),
      samples_per_step_(samples_per_step),
      devices_(devices) {}

std::optional<metrics::FlopUtilisation> RunFlops::at(double samples_per_second) const {
  if (!forward_flops_per_sample_) return std::nullopt;
  return metrics::flop_utilisation(*forward_flops_per_sample_, samples_per_step_, samples_per_second, devices_, peak_);
}

std::string RunFlops::describe() const {
  char text[320];
  if (!forward_flops_per_sample_) return "model FLOPs: not counted for this model (no TFLOP/s or MFU in the record)";
  std::snprintf(text, sizeof(text), "model FLOPs: %.4g TFLOP a step (forward x 3, %lld samples); ",
                3.0 * *forward_flops_per_sample_ * static_cast<double>(samples_per_step_) / 1e12,
                static_cast<long long>(samples_per_step_));
  std::string line = text;
  if (!peak_) return line + "no dense peak known for this device: MFU not reported";
  std::snprintf(text, sizeof(text), "MFU against %.1f TFLOP/s a device (%s)", peak_->flops_per_second / 1e12,
                peak_->basis.c_str());
  return line + text;
}

metrics::MathRate math_rate_of(precision::PrecisionMode mode) {
  switch (mode) {
    case precision::PrecisionMode::FP32: return metrics::MathRate::kFp32;
    case precision::PrecisionMode::TF32: return metrics::MathRate::kTf32;
    case precision::PrecisionMode::FP8: return metrics::MathRate::kFp8;
    case precision::PrecisionMode::FP16:
    case precision::PrecisionMode::BF16:
    case precision::PrecisionMode::AMP_FP16:
    case precision::PrecisionMode::AMP_BF16: return metrics::MathRate::kHalf;
  }
  return metrics::MathRate::kFp32;
}

RunFlops count_run_flops(const models::Model& model, const std::vector<int64_t>& sample_shape,
                         const torch::Device& device, precision::PrecisionMode mode, int64_t samples_per_step,
                         int64_t devices) {
  std::optional<metrics::DensePeak> peak;
  if (device.is_cuda())
    peak = metrics::dense_peak(cuda_runtime::device_properties(device.index()), math_rate_of(mode));
  return RunFlops(model.forward_flops(sample_shape), std::move(peak), samples_per_step, devices);
}

}  // namespace ptrain::train
