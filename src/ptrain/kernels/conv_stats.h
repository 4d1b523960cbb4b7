// A convolution that feeds a batch norm, with the batch norm's statistics taken in the same pass, and the
// previous batch norm's normalisation + ReLU applied as it loads its input: MLPerf ResNet-50's fusion
// (cudnn/conv_stats.h). Forward only so far: what it costs and where cuDNN has an engine for it is measured in
// docs/results/2026-12-04-h200-cudnn-fusion-probe.md; ResNet does not call it yet.
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

}  // namespace ptrain::kernels
