// A convolution that feeds a batch norm, with the batch norm's statistics taken in the same pass, and the
// previous batch norm's normalisation + ReLU applied as it loads its input: MLPerf ResNet-50's fusion
// (cudnn/conv_stats_graph.h). What it costs and where cuDNN has an engine for it is measured in
// docs/results/2026-12-04-h200-cudnn-fusion-probe.md. ResNet's blocks call it through conv_with_stats and
// batch_norm_relu.h's functions on a ConvStatsResult.
#pragma once

#include <torch/torch.h>

#include <string>

namespace ptrain::kernels {

struct ConvStatsResult {
  torch::Tensor y;               // conv2d(x', weight, stride, padding), x' as below
  torch::Tensor sum;             // [K] fp32: y summed over N, H, W per output channel
  torch::Tensor sum_of_squares;  // [K] fp32
};

// x' = relu(x * scale + shift) per input channel when scale is defined (shift then too), else x. No bias, no
// dilation, square filters. Takes cuDNN's fused graph where conv_stats_fused_applies, else LibTorch's ops
// (conv_stats_reference), so it runs everywhere.
ConvStatsResult conv_stats(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride, int64_t padding,
                           const torch::Tensor& scale = {}, const torch::Tensor& shift = {});

// LibTorch's ops: the reference the fused graph is tested against. The statistics are of y as returned (in
// its dtype), accumulated in fp32.
ConvStatsResult conv_stats_reference(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride,
                                     int64_t padding, const torch::Tensor& scale = {},
                                     const torch::Tensor& shift = {});

// Whether conv_stats takes cuDNN's fused graph for these arguments; why not, when it does not.
bool conv_stats_fused_applies(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride, int64_t padding,
                              bool prologue, std::string* why_not = nullptr);

// Whether it takes it through a precompiled engine: what a model should ask before building on it. The only
// engine cuDNN 9.19 has for bf16 statistics on an H200 compiles its kernel at run time and ran 2.3-4.4x slower
// than the convolution alone (the probe above), where the fp16 engine costs a third more. While deterministic
// cuDNN is asked for (at::globalContext().deterministicCuDNN()) none counts: the fused graph's sums vary from
// run to run in their last bits.
bool conv_stats_fused_fast(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride, int64_t padding,
                           bool prologue, std::string* why_not = nullptr);

// conv2d(x, weight, stride, padding) with its output's sum and sum of squares, differentiable in x and weight;
// the sums carry no gradient (a batch norm that takes its statistics from them differentiates through them
// itself: batch_norm_relu.h). The fused graph where it applies, else LibTorch's convolution and reductions.
ConvStatsResult conv_with_stats(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride, int64_t padding);

}  // namespace ptrain::kernels
