// Model FLOP utilisation (MFU): the rate a run does its model's arithmetic at, over the dense peak its device
// offers for the run's precision. What LLM users compare first (PaLM's appendix B, torchtitan's metrics): model
// FLOPs count each matrix product and convolution of the forward once at two FLOPs a multiply-add, and the
// backward as twice the forward; recomputation (activation checkpointing) and elementwise work do not count.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ptrain/core/cuda_runtime.h"

namespace ptrain::metrics {

// The matrix units a precision mode multiplies on: fp32 runs on the plain fp32 cores (TF32 off), tf32 on the
// tensor cores in TF32, pure and mixed fp16/bf16 in half precision, fp8 at the FP8 rate.
enum class MathRate { kFp32, kTf32, kHalf, kFp8 };

// A device's dense (no structured sparsity) peak for one math rate, and where the figure comes from: the vendor's
// datasheet for the GPUs listed in flops.cpp, otherwise multiprocessors x clock x the architecture's dense
// FLOPs a clock and multiprocessor ("derived: ...").
struct DensePeak {
  double flops_per_second = 0.0;
  std::string basis;
};

// Null where no peak is known: a compute capability before 8.0 or one ptrain has no rate for, FP8 before 8.9.
std::optional<DensePeak> dense_peak(const cuda_runtime::DeviceProperties& gpu, MathRate rate);

// "dense bf16/fp16", "dense tf32", ...: how a record names the rate.
std::string math_rate_name(MathRate rate);

// The run's arithmetic against its device: model FLOPs of one optimizer step (the global batch), achieved model
// TFLOP/s per device, and that over the peak (a fraction), when a peak is known.
struct FlopUtilisation {
  double model_flops_per_step = 0.0;
  double tflops = 0.0;
  std::optional<double> mfu;
};

// forward_flops_per_sample: the model's forward on one sample; samples_per_second: the whole job's (every device);
// devices: how many devices share that work.
FlopUtilisation flop_utilisation(double forward_flops_per_sample, int64_t samples_per_step, double samples_per_second,
                                 int64_t devices, const std::optional<DensePeak>& peak);

}  // namespace ptrain::metrics
