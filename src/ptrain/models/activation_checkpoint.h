// Activation checkpointing, which LibTorch lacks (torch.utils.checkpoint is Python only): keep a block's
// input, drop its activations, and recompute them when backward reaches the block.
#pragma once

#include <torch/torch.h>

#include <functional>

namespace ptrain::models {

// Returns fn(input), computed without keeping fn's intermediate tensors. In backward, fn is run again
// on the saved input with the autocast state (CPU and CUDA, enabled and dtype) that forward saw, and
// the incoming gradient is propagated to the input and to owner's parameters (those requiring grad).
// Buffers of owner (BatchNorm running statistics) are restored after the recomputation, so they are
// updated once per step as without checkpointing. fn must be deterministic (no dropout) and use no
// parameters outside owner; owner must outlive the backward pass.
torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& input,
                         torch::nn::Module& owner);

}  // namespace ptrain::models
