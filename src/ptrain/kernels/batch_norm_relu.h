// relu(batch_norm(x) [+ residual]) in training mode, updating the running statistics: every ResNet block's
// "bn, relu" and "bn, add the shortcut, relu". On CUDA, for channels-last activations, the fused kernels of
// cuda/batch_norm.cu make three passes over the activations each way instead of LibTorch's five forward and
// eight backward; elsewhere (and with allow_fused false) LibTorch's batch_norm, add and relu run as before.
// tests/kernels compares the two.
#pragma once

#include <torch/torch.h>

namespace ptrain::kernels {

// weight/bias may be undefined (no affine), residual undefined (no add). running_mean/var are updated with
// momentum (the variance unbiased), as torch.nn.BatchNorm2d in training mode does.
torch::Tensor batch_norm_relu(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight,
                              const torch::Tensor& bias, const torch::Tensor& running_mean,
                              const torch::Tensor& running_var, double momentum, double eps, bool allow_fused);

torch::Tensor reference_batch_norm_relu(const torch::Tensor& x, const torch::Tensor& residual,
                                        const torch::Tensor& weight, const torch::Tensor& bias,
                                        const torch::Tensor& running_mean, const torch::Tensor& running_var,
                                        double momentum, double eps);

// Whether batch_norm_relu(..., allow_fused = true) takes the fused kernels for these tensors: CUDA,
// channels-last, fp32/fp16/bf16 activations with channels a multiple of 16 bytes' worth, affine parameters and
// running statistics in fp32 or the activations' dtype, a residual like x.
bool fused_batch_norm_relu_applies(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight,
                                   const torch::Tensor& running_mean);

}  // namespace ptrain::kernels
