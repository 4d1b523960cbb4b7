// The tensors of one training-mode batch norm for the kernel tests: channels-last activations with an offset mean
// (a variance small beside the mean squared, what naive sums get wrong), an optional residual like them, affine
// parameters and running statistics; and fresh autograd leaves of them for each run.
#pragma once

#include <torch/torch.h>

namespace batch_norm_inputs {

struct Inputs {
  torch::Tensor x, residual, weight, bias, running_mean, running_var;
};

inline Inputs make(int64_t n, int64_t c, int64_t hw, torch::ScalarType dtype, torch::ScalarType param, bool residual,
                   double mean_offset = 3.0) {
  const torch::Device cuda(torch::kCUDA, 0);
  const auto cl = at::MemoryFormat::ChannelsLast;
  Inputs in;
  in.x = (torch::randn({n, c, hw, hw}, torch::device(cuda)) * 2 + mean_offset).to(dtype).contiguous(cl);
  if (residual) in.residual = torch::randn({n, c, hw, hw}, torch::device(cuda)).to(dtype).contiguous(cl);
  in.weight = (torch::rand({c}, torch::device(cuda)) + 0.5).to(param);
  in.bias = (torch::randn({c}, torch::device(cuda)) * 0.1).to(param);
  in.running_mean = (torch::randn({c}, torch::device(cuda)) * 0.1).to(param);
  in.running_var = (torch::rand({c}, torch::device(cuda)) + 0.5).to(param);
  return in;
}

// base's tensors as fresh autograd leaves in dtype `as` (channels-last) and parameters in param_as, with copies
// of its running statistics: .to() of a tensor already in the dtype is the tensor itself.
inline Inputs leaves_of(const Inputs& base, torch::ScalarType as, torch::ScalarType param_as) {
  const auto cl = at::MemoryFormat::ChannelsLast;
  const auto leaf = [](const torch::Tensor& t) { return t.detach().clone().requires_grad_(true); };
  Inputs in;
  in.x = leaf(base.x.to(as).contiguous(cl));
  if (base.residual.defined()) in.residual = leaf(base.residual.to(as).contiguous(cl));
  in.weight = leaf(base.weight.to(param_as));
  in.bias = leaf(base.bias.to(param_as));
  in.running_mean = base.running_mean.to(param_as).clone();
  in.running_var = base.running_var.to(param_as).clone();
  return in;
}

}  // namespace batch_norm_inputs
