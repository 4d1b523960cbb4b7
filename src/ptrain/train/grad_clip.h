// Global gradient-norm clipping with the arithmetic of torch.nn.utils.clip_grad_norm_, kept on the device.
#pragma once

#include <vector>

#include <torch/torch.h>

namespace ptrain::train {

// Scales grads in place so that their joint L2 norm is at most max_norm; returns the norm before
// clipping as a 0-dim float tensor on the grads' device (no host read). Non-finite norms leave the
// grads non-finite, so a loss scaler still sees the overflow.
torch::Tensor clip_grad_norm_(const std::vector<torch::Tensor>& grads, double max_norm);

// Scales grads in place so that their joint norm, total_norm (computed by the caller, e.g. over the
// shards of every rank), becomes at most max_norm.
void clip_grads_to_norm_(const std::vector<torch::Tensor>& grads, const torch::Tensor& total_norm, double max_norm);

// The joint L2 norm alone, in float32 whatever the gradient dtype.
torch::Tensor global_grad_norm(const std::vector<torch::Tensor>& grads);

}  // namespace ptrain::train
