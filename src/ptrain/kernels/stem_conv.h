// ResNet's ImageNet stem, conv2d(x, weight, stride 2, padding 3) with a 7x7 kernel over a few input channels,
// as a 4x4 stride-1 convolution over x's 2x2 space-to-depth: each 2x2 patch of pixels becomes 4C channels
// (padded to a multiple of 8) and the kernel, padded to 8x8 with a leading zero row and column, is regrouped
// the same way. The products and sums are the convolution's own (the padding adds zeros); only cuDNN's
// kernel for it changes. On an H200 (cuDNN 9.19, batch 128, 224 px, channels-last), cuDNN's 7x7 stride-2
// kernels in bf16 pad the input to 8 channels and take 0.86 ms forward and 0.45 ms for the weight gradient;
// the 4x4 form takes 0.04 ms to regroup, 0.35 ms forward and 0.22 ms for the weight gradient. In fp16 (0.29 ms
// forward), fp32 and tf32 cuDNN's own kernels are as fast or faster, so only a convolution that runs in bf16
// takes it (docs/results/2026-12-04-h200-stem-and-bn-tiling.md).
#pragma once

#include <torch/torch.h>

namespace ptrain::kernels {

// x [N, C, H, W] regrouped: [N, round_up(4C, 8), OH + 3, OW + 3] channels-last in dtype, channel
// (s * 2 + t) * C + c holding x[n, c, 2i + s - 4, 2j + t - 4] (zero outside x), OH and OW the stem's output
// size. allow_fused: one CUDA kernel where the build has it, else LibTorch's pad, permute and copy.
torch::Tensor stem_space_to_depth_input(const torch::Tensor& x, c10::ScalarType dtype, bool allow_fused);

// weight [K, C, 7, 7] as the 4x4 form's [K, round_up(4C, 8), 4, 4], through differentiable ops (its gradient
// flows back to weight).
torch::Tensor stem_space_to_depth_weight(const torch::Tensor& weight);

// conv2d(x, weight, stride 2, padding 3) through the 4x4 form. x must not require a gradient (the regrouping
// has no backward; an input image never needs one); weight [K, C, 7, 7], C = x.size(1), no bias.
torch::Tensor stem_conv_space_to_depth(const torch::Tensor& x, const torch::Tensor& weight, bool allow_fused);

// Whether the 4x4 form is the faster one for this stem: a CUDA x not requiring a gradient, a [K, C, 7, 7]
// weight, and a convolution that runs in bf16 (x's dtype, or autocast's for a float x under autocast).
bool stem_space_to_depth_pays(const torch::Tensor& x, const torch::Tensor& weight);

}  // namespace ptrain::kernels
