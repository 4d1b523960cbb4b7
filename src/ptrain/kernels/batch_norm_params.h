// One training-mode batch norm's tensors and settings: what both tiers of this folder take, so that the
// public functions (batch_norm_relu.h) and the tensor-level kernels under them (fused.h) share the type
// without the lower tier including the upper.
#pragma once

#include <torch/torch.h>

namespace ptrain::kernels {

struct BatchNormParams {
  torch::Tensor weight, bias, running_mean, running_var;
  double momentum = 0.1, eps = 1e-5;
};

}  // namespace ptrain::kernels
