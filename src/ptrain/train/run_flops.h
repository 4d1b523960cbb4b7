// The run's model FLOPs and the device peak they are measured against (metrics/flops.h), fixed once the model is
// built: what turns a throughput into TFLOP/s and model FLOP utilisation in the run's record, its progress lines
// and its scalar logs.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ptrain/metrics/flops.h"
#include "ptrain/models/model.h"
#include "ptrain/precision/policy.h"

namespace ptrain::train {

class RunFlops {
 public:
  RunFlops() = default;
  // forward_flops_per_sample: null when the model cannot count its FLOPs; samples_per_step: the global batch of
  // one optimizer step (micro-batches and devices included); devices: the devices that share it.
  RunFlops(std::optional<double> forward_flops_per_sample, std::optional<metrics::DensePeak> peak,
           int64_t samples_per_step, int64_t devices);

  // At samples_per_second (the whole job's); null when the model could not count its FLOPs.
  std::optional<metrics::FlopUtilisation> at(double samples_per_second) const;
  const std::optional<metrics::DensePeak>& peak() const { return peak_; }
  // "model FLOPs 2.45 TFLOP a step (forward x 3); peak 989.4 TFLOP/s a device (H100 SXM5 datasheet, dense bf16)":
  // what the run's header says, with why a figure is missing.
  std::string describe() const;

 private:
  std::optional<double> forward_flops_per_sample_;
  std::optional<metrics::DensePeak> peak_;
  int64_t samples_per_step_ = 0, devices_ = 1;
};

// The matrix units mode multiplies on.
metrics::MathRate math_rate_of(precision::PrecisionMode mode);

// sample_shape: one training sample as the model sees it ([channels, height, width] or [tokens]). A CPU has no
// known peak: its runs report TFLOP/s, not MFU.
RunFlops count_run_flops(const models::Model& model, const std::vector<int64_t>& sample_shape,
                         const torch::Device& device, precision::PrecisionMode mode, int64_t samples_per_step,
                         int64_t devices);

}  // namespace ptrain::train
