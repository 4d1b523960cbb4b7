// What every zoo model offers to the trainer and to the parallel strategies.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ptrain::models {

class Model : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor x) = 0;

  // Recompute each block's activations in backward instead of keeping them (takes effect in training
  // mode with grad enabled).
  virtual void set_activation_checkpointing(bool on) {}

  // Use the fused CUDA kernels of kernels/ where they apply (ResNet: batch norm + ReLU, + residual), or
  // LibTorch's unfused ops. Models without fusable parts ignore it.
  virtual void set_fused_kernels(bool on) {}

  virtual std::string name() const = 0;

  // A new model of the same architecture and settings (activation checkpointing included) with its own,
  // freshly initialised parameters: what one-process data parallelism keeps a copy of per device.
  virtual std::shared_ptr<Model> make_replica() const;

  // The top-level blocks in forward order, together holding every parameter and buffer once: the units
  // that sharding, wrapping and pipelining strategies work with. A unit's parameters are named relative
  // to the unit name (unit "layer1.0" holds "conv1.weight", i.e. "layer1.0.conv1.weight"), except for
  // the "stem" and "head" units, which group top-level modules under their own names ("conv1.weight").
  virtual std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> units() = 0;

  // Runs unit `index` of units() alone; forward(x) is these applied in order, index 0 first.
  virtual torch::Tensor forward_unit(size_t index, torch::Tensor x) = 0;
};

}  // namespace ptrain::models
