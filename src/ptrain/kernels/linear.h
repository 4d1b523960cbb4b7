// A linear layer, y = x W^T + b, optionally followed by GELU (tanh approximation, GPT-2's), whose backward adds
// up the bias gradient in one pass at the memory's speed (cuda/column_sums.cuh) and, with GELU, applies GELU's
// backward in that same pass. LibTorch's backward reduced each bias gradient at about a third of the bandwidth,
// and read GELU's gradient twice; the products are LibTorch's either way (the same cuBLAS calls, bit for bit).
// tests/kernels compares the two paths.
#pragma once

#include <torch/torch.h>

namespace ptrain::kernels {

enum class LinearActivation { kNone, kGeluTanh };

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                     LinearActivation activation, bool allow_fused);

// LibTorch's linear (and gelu): what linear computes where the fused backward does not apply.
torch::Tensor reference_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                               LinearActivation activation);

// Where the fused backward applies: x [..., in], weight [out, in] and bias [out] of one kernel dtype on a device
// with fused kernels, out a multiple of 8, and autocast off or computing in that same dtype (so that it casts
// none of them: the backward takes the tensors as the product saw them).
bool fused_linear_applies(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

}  // namespace ptrain::kernels
