// How long a bench will take, said before it starts: "expected: 31 runs, about 9 minutes", with what the figure
// rests on. Each run costs its processes' start (CUDA and cuDNN set up, the model built, torch imported, compiled)
// and its steps; a step's time is what an earlier record in --out measured for the same run (or precision), or
// else the model's FLOPs over the device's dense peak at an assumed model FLOP utilisation. Evaluation and data
// loading are not counted, and the line says so. Internal to bench/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ptrain/config/train_config.h"
#include "ptrain/metrics/flops.h"

namespace ptrain::bench {

// Seconds a run spends outside its steps, from the H200 pages under docs/results (2026-12-02-h200-all-modes: a warm
// 20-step ResNet-50 amp-bf16 run took 6.5 s from ptrain's launch to its end, 13.8 s in PyTorch eager, whose start
// imports torch and torchvision); torch.compile adds 30-90 s on a cold cache (2026-12-02-h200-speed); `ptrain
// estimate` two probe processes; `ptrain launch` and torchrun a rendezvous and NCCL's set-up (assumed).
inline constexpr double kPtrainStartSeconds = 6.0;
inline constexpr double kPytorchStartSeconds = 13.0;
inline constexpr double kCompileSeconds = 60.0;
inline constexpr double kEstimateSeconds = 15.0;
inline constexpr double kLaunchSeconds = 4.0;
// The CUDA driver compiling LibTorch's and cuDNN's PTX kernels the first time a machine trains a dtype: 15.6 s in
// ptrain's first amp-bf16 run, 16.6 s in PyTorch's (the same page); counted once per dtype of a GPU bench, where a
// warm-up or the first run pays it.
inline constexpr double kJitSecondsPerDtype = 16.0;
// cuDNN's search for the fastest fp32 convolution algorithms (TF32 off), which every process pays again in its first
// steps: ResNet-50's first 10 fp32 steps took about 30 s on an H100 in ptrain and in PyTorch eager alike (the quick
// suite's call, docs/results/2026-12-06-h100-quick-suite.md), against about 1.3 s at the steady rate. No warm-up
// takes it off a later process.
inline constexpr double kFp32ConvolutionSearchSeconds = 28.0;

// Model FLOP utilisation assumed where no record tells a step's time: ResNet-50's at batch 128, the standard
// workload (fp32 997 img/s on an H200, 37% of its 67 TFLOP/s; tf32 3,466 img/s, 17%; amp-bf16 14.5% on an H100,
// 2026-12-06-h100-roofline); GPTs run nearer 40%, so their runs take less than estimated.
double assumed_mfu(metrics::MathRate rate);
// Without a GPU: the model FLOPs a second two CPU cores train at, assumed (ResNet-20 on Fashion-MNIST).
inline constexpr double kCpuFlopsPerSecond = 20e9;

// What the estimate knows of one job of the bench.
struct JobDuration {
  bool pytorch = false;        // PyTorch's reference rather than ptrain
  bool compiled = false;       // torch.compile
  bool estimate = false;       // `ptrain estimate` runs first
  bool multi_process = false;  // under `ptrain launch` or torchrun
  bool fp32_convolution_search = false;  // a GPU run in fp32 of a model with convolutions
  int64_t steps = 0;
  // Seconds a step, measured by an earlier record in --out (measured = true) or from FLOPs; none: unknown.
  std::optional<double> step_seconds;
  bool measured = false;
};

struct DurationEstimate {
  double seconds = 0.0;  // everything below
  double start_seconds = 0.0, step_seconds = 0.0, jit_seconds = 0.0, warm_up_seconds = 0.0;
  int64_t jobs = 0, steps = 0;
  int64_t measured = 0, from_flops = 0, unknown = 0;  // jobs by where their step time came from
};

// The bench's expected duration: each job's start and steps, the JIT once per dtype (jit_dtypes: the GPU dtypes
// of the jobs to run; 0 on the CPU), and the warm-up jobs (warm_up_jobs, a framework's side by side: each
// framework's slowest start, their few steps ignored).
DurationEstimate expected_duration(const std::vector<JobDuration>& jobs, int64_t jit_dtypes,
                                   const std::vector<JobDuration>& warm_up_jobs);

// Seconds a training step of batch_per_device samples takes at an assumed utilisation of peak_flops_per_second:
// forward FLOPs of a sample x 3 (the backward twice the forward) x the batch / (peak x MFU).
double step_seconds_from_flops(double forward_flops_per_sample, int64_t batch_per_device, double peak_flops_per_second,
                               double mfu);

// The model FLOPs of one training sample's forward for the job config trains: image models of the zoo built on the
// CPU at the workload's image size (channels and native size by dataset: 1 and 28 for the MNISTs, 3 and 32 for the
// CIFARs, 3 and 224 otherwise), language models as 2 x parameters a token (counted without building them) x the
// sequence; none for models that cannot say (a TorchScript file) or whose build fails.
std::optional<double> forward_flops_per_sample(const config::TrainConfig& config);

// What the FLOP-based step times rest on: on a GPU, the assumed utilisation of its dense peak (metrics/flops.h's
// basis, e.g. "datasheet, NVIDIA H100 SXM5"); on the CPU, kCpuFlopsPerSecond.
std::string gpu_flops_basis(const std::string& device_name, const std::string& peak_basis);
std::string cpu_flops_basis();

// One line for the bench's log: "expected: 31 runs, about 9 minutes (524 s): ..." with what it rests on;
// flops_basis: gpu_flops_basis or cpu_flops_basis.
std::string duration_line(const DurationEstimate& estimate, const std::string& flops_basis);

}  // namespace ptrain::bench
