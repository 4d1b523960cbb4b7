// max_pool2d for training: ResNet's stem pools 3x3 with stride 2 over its largest activations. On CUDA, for
// channels-last fp32/fp16/bf16 tensors, the kernels of cuda/max_pool.cu keep a byte per output for the
// backward (where in its window the maximum was) instead of LibTorch's int64 index, and give LibTorch's
// outputs and gradients bit for bit; elsewhere (and with allow_fused false) torch::max_pool2d runs.
// tests/kernels compares the two.
#pragma once

#include <torch/torch.h>

namespace ptrain::kernels {

// Square kernel, no dilation, floor mode, padding at most half the kernel.
torch::Tensor max_pool2d(const torch::Tensor& x, int64_t kernel, int64_t stride, int64_t padding, bool allow_fused);

// Whether max_pool2d(..., allow_fused = true) takes the fused kernels for x.
bool fused_max_pool2d_applies(const torch::Tensor& x, int64_t kernel, int64_t stride, int64_t padding);

}  // namespace ptrain::kernels
