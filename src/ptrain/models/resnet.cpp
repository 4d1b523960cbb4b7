#include "ptrain/models/resnet.h"

#include <algorithm>

#include "ptrain/core/error.h"
#include "ptrain/kernels/average_pool.h"
#include "ptrain/kernels/conv_stats.h"
#include "ptrain/kernels/parameter_cast.h"
#include "ptrain/kernels/stem_conv.h"
#include "ptrain/models/activation_checkpoint.h"

namespace ptrain::models {

namespace nn = torch::nn;

namespace {

nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding).bias(false));
}

nn::Conv2d conv3x3(int64_t in, int64_t out, int64_t stride) { return conv(in, out, 3, stride, 1); }
nn::Conv2d conv1x1(int64_t in, int64_t out, int64_t stride) { return conv(in, out, 1, stride, 0); }

struct Family {
  bool bottleneck;
  std::vector<int> blocks_per_stage;
};

Family family_of(int depth) {
  switch (depth) {
    case 18: return {false, {2, 2, 2, 2}};
    case 34: return {false, {3, 4, 6, 3}};
    case 50: return {true, {3, 4, 6, 3}};
    case 101: return {true, {3, 4, 23, 3}};
    case 152: return {true, {3, 8, 36, 3}};
    case 20: case 32: case 44: case 56: {
      const int n = (depth - 2) / 6;
      return {false, {n, n, n}};
    }
    default: break;
  }
  std::string known;
  for (int d : resnet_depths()) known += (known.empty() ? "" : ", ") + std::to_string(d);
  throw Error("ResNet depth " + std::to_string(depth) + " is not one of " + known);
}

bool is_cifar_depth(int depth) { return depth == 20 || depth == 32 || depth == 44 || depth == 56; }

// Holds the top-level conv1 and bn1 under their own names, as the "stem" unit.
struct Stem : nn::Module {
  Stem(nn::Conv2d conv1, BatchNorm2d bn1) {
    register_module("conv1", std::move(conv1));
    register_module("bn1", std::move(bn1));
  }
};

}  // namespace

// The residual blocks of torchvision's resnet.py: the same submodule names, so the same state_dict keys.
class ResidualBlock : public nn::Module {
 public:
  torch::Tensor forward(torch::Tensor x) { return forward_twin(x, x, nullptr); }
  // The block on x, with shortcut_in (x, or a twin of x: the same values on a second autograd edge) as the
  // shortcut's input; twin_out (may be null): set to a twin of the output where the block's last batch norm makes
  // one (kernels::batch_norm_relu), undefined otherwise.
  virtual torch::Tensor forward_twin(const torch::Tensor& x, const torch::Tensor& shortcut_in,
                                     torch::Tensor* twin_out) = 0;
  virtual BatchNorm2d last_bn() = 0;
  virtual int64_t out_channels() const = 0;

  // Whether the last training forward took the convolution + batch norm fusion; why not, when it did not.
  bool took_conv_stats() const { return took_conv_stats_; }
  bool downsamples() const { return !downsample.is_empty(); }
  // The shortcut's convolution, for counting FLOPs; null for an identity shortcut.
  const nn::Conv2dImpl* shortcut_conv() const {
    return downsample.is_empty() ? nullptr : downsample->ptr(0)->as<nn::Conv2d>();
  }
  const std::string& conv_stats_why_not() const { return conv_stats_why_not_; }

 protected:
  void make_downsample(int64_t in, int64_t out, int64_t stride) {
    if (stride == 1 && in == out) return;
    downsample = register_module("downsample", nn::Sequential(conv1x1(in, out, stride), BatchNorm2d(out)));
  }
  // relu(last(out) + shortcut(shortcut_in)): with a downsampling shortcut, its batch norm runs with the block's last
  // (BatchNorm2dImpl::forward_relu_add_norm).
  torch::Tensor finish(BatchNorm2dImpl& last, const torch::Tensor& out, const torch::Tensor& shortcut_in,
                       torch::Tensor* twin_out) {
    if (downsample.is_empty()) return last.forward_relu(out, shortcut_in, twin_out);
    const auto shortcut = kernels::forward_with_casts(*downsample[0]->as<nn::Conv2d>(), shortcut_in);
    return last.forward_relu_add_norm(out, *downsample[1]->as<BatchNorm2d>(), shortcut, twin_out);
  }

  // The shortcut with its convolution's statistics handed to its batch norm.
  torch::Tensor shortcut_from_stats(const torch::Tensor& x) {
    if (downsample.is_empty()) return x;
    auto& conv = *downsample[0]->as<nn::Conv2d>();
    auto& norm = *downsample[1]->as<BatchNorm2d>();
    const auto stats =
        kernels::conv_with_stats(x, BatchNorm2dImpl::conv_weight_like(conv, x), (*conv.options.stride())[0], 0);
    return norm.forward_from_stats(stats);
  }

  // Whether this block's convolutions hand their statistics to its batch norms (MLPerf's fusion: every batch
  // norm takes them for activations like x, and cuDNN has a precompiled engine for the graph of the first
  // convolution, which stands for the dtype); then first_weight is that convolution's weight cast as it will run.
  // Records the answer of a training forward for took_conv_stats (evaluation never takes it).
  bool conv_stats_apply(const torch::Tensor& x, nn::Conv2dImpl& first, int64_t padding,
                        const std::vector<BatchNorm2dImpl*>& norms, torch::Tensor* first_weight) {
    if (!is_training()) return false;
    took_conv_stats_ = false;
    conv_stats_why_not_.clear();
    std::vector<BatchNorm2dImpl*> all = norms;
    if (!downsample.is_empty()) all.push_back(downsample[1]->as<BatchNorm2d>());
    for (auto* norm : all) {
      if (!norm->accepts_conv_stats(x)) {
        conv_stats_why_not_ = "a batch norm runs without the fused kernels or the fusion";
        return false;
      }
    }
    *first_weight = BatchNorm2dImpl::conv_weight_like(first, x);
    took_conv_stats_ = kernels::conv_stats_fused_fast(x, *first_weight, (*first.options.stride())[0], padding,
                                                      /*prologue=*/false, &conv_stats_why_not_);
    return took_conv_stats_;
  }

  nn::Sequential downsample{nullptr};

 private:
  bool took_conv_stats_ = false;
  std::string conv_stats_why_not_;
};

namespace {

class BasicBlock : public ResidualBlock {
 public:
  BasicBlock(int64_t in, int64_t planes, int64_t stride) : planes_(planes) {
    conv1 = register_module("conv1", conv3x3(in, planes, stride));
    bn1 = register_module("bn1", BatchNorm2d(planes));
    conv2 = register_module("conv2", conv3x3(planes, planes, 1));
    bn2 = register_module("bn2", BatchNorm2d(planes));
    make_downsample(in, planes, stride);
  }

  torch::Tensor forward_twin(const torch::Tensor& x, const torch::Tensor& shortcut_in, torch::Tensor* twin_out) override {
    torch::Tensor w1;
    if (conv_stats_apply(x, *conv1, 1, {bn1.get(), bn2.get()}, &w1)) {
      const int64_t stride = (*conv1->options.stride())[0];
      auto out = bn1->forward_relu_conv_from_stats(kernels::conv_with_stats(x, w1, stride, 1), *conv2);
      return bn2->forward_relu_from_stats(out, shortcut_from_stats(shortcut_in), twin_out);
    }
    auto out = bn1->forward_relu_conv(kernels::forward_with_casts(*conv1, x), *conv2);
    return finish(*bn2, out, shortcut_in, twin_out);
  }
  BatchNorm2d last_bn() override { return bn2; }
  int64_t out_channels() const override { return planes_; }

 private:
  int64_t planes_;
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  BatchNorm2d bn1{nullptr}, bn2{nullptr};
};

class Bottleneck : public ResidualBlock {
 public:
  static constexpr int64_t kExpansion = 4;

  Bottleneck(int64_t in, int64_t planes, int64_t stride) : planes_(planes) {
    conv1 = register_module("conv1", conv1x1(in, planes, 1));
    bn1 = register_module("bn1", BatchNorm2d(planes));
    conv2 = register_module("conv2", conv3x3(planes, planes, stride));  // v1.5: the stride sits here
    bn2 = register_module("bn2", BatchNorm2d(planes));
    conv3 = register_module("conv3", conv1x1(planes, planes * kExpansion, 1));
    bn3 = register_module("bn3", BatchNorm2d(planes * kExpansion));
    make_downsample(in, planes * kExpansion, stride);
  }

  torch::Tensor forward_twin(const torch::Tensor& x, const torch::Tensor& shortcut_in, torch::Tensor* twin_out) override {
    torch::Tensor w1;
    if (conv_stats_apply(x, *conv1, 0, {bn1.get(), bn2.get(), bn3.get()}, &w1)) {
      auto out = bn1->forward_relu_conv_from_stats(kernels::conv_with_stats(x, w1, 1, 0), *conv2);
      out = bn2->forward_relu_conv_from_stats(out, *conv3);
      return bn3->forward_relu_from_stats(out, shortcut_from_stats(shortcut_in), twin_out);
    }
    auto out = bn1->forward_relu_conv(kernels::forward_with_casts(*conv1, x), *conv2);
    out = bn2->forward_relu_conv(out, *conv3);
    return finish(*bn3, out, shortcut_in, twin_out);
  }
  BatchNorm2d last_bn() override { return bn3; }
  int64_t out_channels() const override { return planes_ * kExpansion; }

 private:
  int64_t planes_;
  nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
};

}  // namespace

const std::vector<int>& resnet_depths() {
  static const std::vector<int> depths = {18, 34, 50, 101, 152, 20, 32, 44, 56};
  return depths;
}

ResNet::ResNet(const ResNetOptions& options) : options_(options) {
  const Family family = family_of(options.depth);
  cifar_family_ = is_cifar_depth(options.depth);
  check(options.num_classes > 0, "ResNet: num_classes must be positive, got " + std::to_string(options.num_classes));
  check(options.in_channels > 0, "ResNet: in_channels must be positive, got " + std::to_string(options.in_channels));

  const int64_t stem_width = cifar_family_ ? 16 : 64;
  if (!imagenet_stem()) {
    conv1 = register_module("conv1", conv3x3(options.in_channels, stem_width, 1));
  } else {
    conv1 = register_module("conv1", conv(options.in_channels, stem_width, 7, 2, 3));
  }
  bn1 = register_module("bn1", BatchNorm2d(stem_width));

  int64_t channels = stem_width;
  for (size_t stage = 0; stage < family.blocks_per_stage.size(); ++stage) {
    const int64_t planes = stem_width << stage;
    auto layer = register_module("layer" + std::to_string(stage + 1), nn::ModuleList());
    for (int i = 0; i < family.blocks_per_stage[stage]; ++i) {
      const int64_t stride = (stage > 0 && i == 0) ? 2 : 1;
      std::shared_ptr<ResidualBlock> block;
      if (family.bottleneck) {
        block = std::make_shared<Bottleneck>(channels, planes, stride);
      } else {
        block = std::make_shared<BasicBlock>(channels, planes, stride);
      }
      channels = block->out_channels();
      layer->push_back(block);
      blocks_.emplace_back("layer" + std::to_string(stage + 1) + "." + std::to_string(i), block);
    }
  }
  fc = register_module("fc", nn::Linear(channels, options.num_classes));
  stem_ = std::make_shared<Stem>(conv1, bn1);

  // torchvision's initialisation; Linear keeps its default, as there.
  torch::NoGradGuard no_grad;
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* c = module->as<nn::Conv2d>()) {
      nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* bn = module->as<BatchNorm2d>()) {
      nn::init::ones_(bn->weight);
      nn::init::zeros_(bn->bias);
    }
  }
  if (options.zero_init_residual) {
    for (auto& [name, block] : blocks_) nn::init::zeros_(block->last_bn()->weight);
  }
}

std::optional<double> ResNet::forward_flops(const std::vector<int64_t>& sample_shape) const {
  check(sample_shape.size() == 3, "ResNet::forward_flops: a sample is [channels, height, width]");
  int64_t height = sample_shape[1], width = sample_shape[2];
  double flops = conv2d_forward_flops(*conv1, height, width);
  if (imagenet_stem()) {  // torchvision's 3x3 stride-2 max pooling, padding 1
    height = (height - 1) / 2 + 1;
    width = (width - 1) / 2 + 1;
  }
  for (const auto& [name, block] : blocks_) {
    // The shortcut's convolution sees the block's input; the main path's run one after another in the order the
    // block registered them (conv1, conv2[, conv3]).
    if (const auto* shortcut = block->shortcut_conv()) {
      int64_t h = height, w = width;
      flops += conv2d_forward_flops(*shortcut, h, w);
    }
    for (const auto& child : block->named_children()) {
      if (const auto* conv = child.value()->as<nn::Conv2d>()) flops += conv2d_forward_flops(*conv, height, width);
    }
  }
  return flops + 2.0 * static_cast<double>(fc->options.in_features() * fc->options.out_features());
}

std::string ResNet::name() const {
  const std::string base = "resnet" + std::to_string(options_.depth);
  return (options_.cifar_stem && !cifar_family_) ? base + "-cifar" : base;
}

std::shared_ptr<Model> ResNet::make_replica() const {
  auto replica = std::make_shared<ResNet>(options_);
  replica->set_activation_checkpointing(checkpointing_);
  replica->set_fused_kernels(fused_kernels_);
  replica->set_relu_recompute(relu_recompute_);
  replica->set_conv_bn_fusion(conv_bn_fusion_);
  replica->set_fusions(fusions_);
  return replica;
}

void ResNet::set_relu_recompute(bool on) {
  relu_recompute_ = on;
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* bn = module->as<BatchNorm2d>()) bn->set_relu_recompute(on);
  }
}

void ResNet::set_conv_bn_fusion(bool on) {
  conv_bn_fusion_ = on;
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* bn = module->as<BatchNorm2d>()) bn->set_conv_stats(on);
  }
}

void ResNet::set_fusions(const FusionChoices& choices) {
  fusions_ = choices;
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* bn = module->as<BatchNorm2d>()) bn->set_fusions(choices);
  }
}

std::vector<std::string> ResNet::fusions() const {
  std::vector<std::string> names = {"weight-casts", "shortcut-norms"};
  if (imagenet_stem()) names.push_back("stem-pool");
  if (!checkpointing_) names.push_back("residual-twins");  // no twins across a checkpoint (run_block)
  return names;
}

std::vector<std::string> ResNet::fusions_bypassed() const {
  if (!conv_bn_fusion_) return {};
  size_t downsampling = 0, took = 0;
  for (const auto& [name, block] : blocks_) {
    if (!block->downsamples()) continue;
    ++downsampling;
    if (block->took_conv_stats()) ++took;
  }
  if (downsampling > 0 && took == downsampling) return {"shortcut-norms"};
  return {};
}

std::string ResNet::describe_conv_bn_fusion() const {
  if (!conv_bn_fusion_) return "off";
  size_t took = 0;
  std::string why_not;
  for (const auto& [name, block] : blocks_) {
    if (block->took_conv_stats()) {
      ++took;
    } else if (why_not.empty() && !block->conv_stats_why_not().empty()) {
      why_not = name + ": " + block->conv_stats_why_not();
    }
  }
  std::string out = "cuDNN convolution + statistics graphs in " + std::to_string(took) + " of " +
                    std::to_string(blocks_.size()) + " blocks";
  return why_not.empty() ? out : out + " (" + why_not + ")";
}

void ResNet::set_fused_kernels(bool on) {
  fused_kernels_ = on;
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* bn = module->as<BatchNorm2d>()) bn->set_fused_kernels(on);
  }
}

torch::Tensor ResNet::stem_conv(const torch::Tensor& x) {
  const bool space_to_depth =
      fused_kernels_ && imagenet_stem() && kernels::stem_space_to_depth_pays(x, conv1->weight);
  if (is_training()) stem_space_to_depth_ = space_to_depth;
  return space_to_depth ? kernels::stem_conv_space_to_depth(x, kernels::ParameterCastScope::cast_of(conv1->weight),
                                                             /*allow_fused=*/true)
                        : kernels::forward_with_casts(*conv1, x);
}

std::string ResNet::describe_stem_conv() const {
  if (!imagenet_stem()) return {};
  return stem_space_to_depth_ ? "space-to-depth 4x4" : "7x7";
}

torch::Tensor ResNet::run_block(ResidualBlock& block, const torch::Tensor& x, torch::Tensor* twin) {
  if (twin) *twin = torch::Tensor();
  if (checkpointing_ && is_training() && torch::GradMode::is_enabled()) {
    // The recomputation runs the block on its one input: no twins across a checkpoint.
    return checkpoint([&block](const torch::Tensor& in) { return block.forward(in); }, x, block);
  }
  const torch::Tensor& shortcut_in = twin_.defined() && x.is_same(twin_of_) ? twin_ : x;
  return block.forward_twin(x, shortcut_in, twin);
}

std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> ResNet::units() {
  std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> result;
  result.emplace_back("stem", stem_);
  for (auto& [name, block] : blocks_) result.emplace_back(name, block);
  result.emplace_back("fc", fc.ptr());
  return result;
}

torch::Tensor ResNet::forward_unit(size_t index, torch::Tensor x) {
  check(index < blocks_.size() + 2, "ResNet::forward_unit: index " + std::to_string(index) + " is beyond the " +
                                        std::to_string(blocks_.size() + 2) + " units");
  // The unit's weights cast as one group under autocast (with the fused kernels and the weight-casts fusion;
  // without, autocast's own casts).
  const auto unit = index == 0 ? std::static_pointer_cast<nn::Module>(stem_)
                               : index <= blocks_.size() ? std::static_pointer_cast<nn::Module>(blocks_[index - 1].second)
                                                         : fc.ptr();
  const bool grouped = fused_kernels_ && fusions_.weight_casts;
  const kernels::ParameterCastScope casts(
      grouped ? kernels::layer_parameters<nn::Conv2d, nn::Linear>(*unit) : std::vector<torch::Tensor>(), x.device(),
      /*allow_fused=*/true);
  if (index == 0) {
    twin_of_ = twin_ = torch::Tensor();
    return imagenet_stem() ? bn1->forward_relu_max_pool(stem_conv(x), 3, 2, 1) : bn1->forward_relu(stem_conv(x));
  }
  if (index <= blocks_.size()) {
    // A twin only where the next unit is a block (its convolution and shortcut both take this output).
    torch::Tensor twin;
    const bool wants_twin = fusions_.residual_twins && index < blocks_.size();
    auto y = run_block(*blocks_[index - 1].second, x, wants_twin ? &twin : nullptr);
    twin_of_ = twin.defined() ? y : torch::Tensor();
    twin_ = std::move(twin);
    return y;
  }
  twin_of_ = twin_ = torch::Tensor();
  x = kernels::global_average_pool(x);
  return kernels::forward_with_casts(*fc, x);
}

torch::Tensor ResNet::forward(torch::Tensor x) {
  const size_t count = blocks_.size() + 2;
  for (size_t i = 0; i < count; ++i) x = forward_unit(i, x);
  return x;
}

}  // namespace ptrain::models
