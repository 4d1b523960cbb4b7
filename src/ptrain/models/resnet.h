// torchvision's ResNets (v1.5: stride on the 3x3 convolution), with its module names, so that its
// state_dicts load as they are; and the CIFAR ResNets of He et al. 2016 (depths 20, 32, 44, 56).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ptrain/models/batch_norm.h"
#include "ptrain/models/model.h"

namespace ptrain::models {

struct ResNetOptions {
  int depth = 50;  // 18, 34, 50, 101, 152 (torchvision) or 20, 32, 44, 56 (CIFAR, He et al. 2016)
  int64_t num_classes = 1000;
  int64_t in_channels = 3;
  // torchvision depths only: a 3x3 stride-1 conv1 and no max-pool, for 32x32 and 28x28 images.
  bool cifar_stem = false;
  // Zero the last BatchNorm weight of each residual block, so that every block starts as the identity.
  bool zero_init_residual = false;
};

class ResidualBlock;

class ResNet : public Model {
 public:
  explicit ResNet(const ResNetOptions& options);

  torch::Tensor forward(torch::Tensor x) override;
  void set_activation_checkpointing(bool on) override { checkpointing_ = on; }
  void set_fused_kernels(bool on) override;
  void set_relu_recompute(bool on) override;
  void set_conv_bn_fusion(bool on) override;
  std::string describe_conv_bn_fusion() const override;
  std::vector<std::string> fusions_bypassed() const override;
  void set_fusions(const FusionChoices& choices) override;
  std::vector<std::string> fusions() const override;
  std::string describe_stem_conv() const override;
  std::string name() const override;
  std::optional<double> forward_flops(const std::vector<int64_t>& sample_shape) const override;
  std::shared_ptr<Model> make_replica() const override;
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> units() override;
  torch::Tensor forward_unit(size_t index, torch::Tensor x) override;

  const ResNetOptions& options() const { return options_; }

 private:
  // twin (may be null): asks the block for a twin of its output (kernels::batch_norm_relu).
  torch::Tensor run_block(ResidualBlock& block, const torch::Tensor& x, torch::Tensor* twin);
  // conv1, through kernels/stem_conv.h's space-to-depth form where that is faster (bf16 on CUDA, fused kernels on).
  torch::Tensor stem_conv(const torch::Tensor& x);
  // torchvision's 7x7 stride-2 conv1 and max pooling, not the CIFAR stem's 3x3 conv1.
  bool imagenet_stem() const { return !cifar_family_ && !options_.cifar_stem; }

  ResNetOptions options_;
  bool checkpointing_ = false;
  bool fused_kernels_ = false;
  bool relu_recompute_ = false;
  bool conv_bn_fusion_ = false;
  FusionChoices fusions_;
  bool stem_space_to_depth_ = false;  // what the last training forward's stem took
  bool cifar_family_ = false;
  torch::nn::Conv2d conv1{nullptr};
  BatchNorm2d bn1{nullptr};
  std::vector<std::pair<std::string, std::shared_ptr<ResidualBlock>>> blocks_;  // "layer1.0", ...
  torch::nn::Linear fc{nullptr};
  std::shared_ptr<torch::nn::Module> stem_;  // conv1 and bn1, for units()
  // The last block's output and its twin, for the next block's shortcut when forward_unit is handed that
  // output: its gradient then reaches the block's backward kernels apart (kernels::batch_norm_relu's twin).
  torch::Tensor twin_of_, twin_;
};

// The depths ResNetOptions accepts.
const std::vector<int>& resnet_depths();

}  // namespace ptrain::models
