// cuDNN's fused graph for a convolution that feeds a batch norm, on raw device pointers (no LibTorch header,
// like cuda/launch.h): y = conv(x', w) with x' = relu(x * scale + shift) applied in the convolution's
// prologue (or x' = x), and y's per-channel sum and sum of squares produced in its epilogue (cuDNN's genstats),
// in one kernel. This is the MLPerf ResNet-50 recipe: the batch norm's statistics come out of the convolution
// that makes its input, and its normalisation + ReLU goes into the next convolution's load, so neither reads
// the activations again. Built through cuDNN's backend graph API (cudnn_backend.h), which every cuDNN 9
// ships; the cudnn-frontend headers that wrap it are no Debian package and would be the only reason to vendor
// a 3 MB header library.
//
// Which graphs an engine exists for is cuDNN's and the GPU's to say: with cuDNN 9.19 on an H200, fp16 has a
// precompiled engine for both forms, bf16 only a runtime-compiled one for the statistics and none with the
// prologue (docs/results/2026-12-04-h200-cudnn-fusion-probe.md). Callers ask conv_stats_plan first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

namespace ptrain::kernels::cudnn {

enum class Dtype { kHalf, kBFloat16 };

// NHWC x [n, c, h, w], KRSC w [k, c, r, r] (both as channels-last tensors), square stride and padding, no
// dilation; y [n, k, p, q] NHWC. scale and shift [c] in dtype; sum and sum of squares [k] fp32.
struct ConvStatsShape {
  int64_t n = 0, c = 0, h = 0, w = 0, k = 0, r = 0, stride = 1, padding = 0;
  Dtype dtype = Dtype::kHalf;
  bool prologue = false;  // relu(x * scale + shift) before the convolution
  int64_t out_h() const { return (h + 2 * padding - r) / stride + 1; }
  int64_t out_w() const { return (w + 2 * padding - r) / stride + 1; }
};

struct ConvStatsPlanInfo {
  bool supported = false;
  std::string why_not;           // cuDNN's words when no engine takes the graph
  size_t workspace_bytes = 0;
  int64_t engine = -1;           // cuDNN's global engine index
  bool runtime_compiled = false; // the engine compiles its kernel at plan time (NVRTC)
  bool nondeterministic = false; // cuDNN's numerical note: results may differ from run to run (atomics)
};

// The plan for shape on the current device, built on first use and kept for this thread (the heuristics
// take milliseconds and a runtime-compiled engine seconds: outside any CUDA graph capture).
ConvStatsPlanInfo conv_stats_plan(const ConvStatsShape& shape);

// Runs the plan on stream. Throws std::runtime_error with cuDNN's message when the shape has no plan or the
// launch fails. scale and shift are ignored without the prologue; workspace holds the plan's workspace_bytes.
// sum and sum_of_squares must hold zeros: cuDNN does not say whether genstats overwrites them or adds to them.
void conv_stats(const ConvStatsShape& shape, const void* x, const void* w, const void* scale, const void* shift,
                void* y, float* sum, float* sum_of_squares, void* workspace, cudaStream_t stream);

}  // namespace ptrain::kernels::cudnn
