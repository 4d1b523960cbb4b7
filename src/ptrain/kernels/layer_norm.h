// The transformer block's residual add and LayerNorm: sum = x + branch, out = layer_norm(sum) * weight + bias,
// with out in the dtype the next matrix product computes in. On CUDA, for an fp32 residual stream (fp32, tf32
// and the amp modes), the fused kernels of cuda/layer_norm.cu; elsewhere LibTorch's add, layer_norm and cast.
// tests/kernels compares the two.
#pragma once

#include <torch/torch.h>

namespace ptrain::kernels {

struct AddLayerNorm {
  torch::Tensor sum;       // x + branch (x itself without a branch)
  torch::Tensor out;       // layer_norm(sum), in out_dtype
  torch::Tensor out_amax;  // with_amax on the fused path: out's amax for its FP8 cast (fp8_linear's x_amax)
};

// branch may be undefined: then a plain LayerNorm of x. weight and bias [C], fp32 for the fused path.
// with_amax: the fused kernel also takes out's amax as it writes out (undefined on LibTorch's path, where the FP8
// cast takes its own).
AddLayerNorm add_layer_norm(const torch::Tensor& x, const torch::Tensor& branch, const torch::Tensor& weight,
                            const torch::Tensor& bias, double eps, c10::ScalarType out_dtype, bool allow_fused,
                            bool with_amax = false);

AddLayerNorm reference_add_layer_norm(const torch::Tensor& x, const torch::Tensor& branch, const torch::Tensor& weight,
                                      const torch::Tensor& bias, double eps, c10::ScalarType out_dtype);

bool fused_add_layer_norm_applies(const torch::Tensor& x, const torch::Tensor& branch, const torch::Tensor& weight,
                                  c10::ScalarType out_dtype);

}  // namespace ptrain::kernels
