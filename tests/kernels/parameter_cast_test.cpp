// Grouped parameter casts (kernels/parameter_cast.h) against the per-parameter casts autocast makes: the casts
// and the gradients cast back, bit for bit, in the parameters' strides; the scope's answers; and a ResNet step under
// CPU autocast, grouped and not. On a GPU, the one-kernel cast in fp16 and bf16, subnormals and many tensors.
#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include "gpu.h"
#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/kernels/parameter_cast.h"
#include "ptrain/models/gpt.h"
#include "ptrain/models/resnet.h"

namespace {

using ptrain::kernels::cast_parameters;
using ptrain::kernels::ParameterCastScope;

// A convolution's weight (channels-last, as the trainer keeps them), a linear layer's weight and bias, and odd
// sizes, as leaves on device.
std::vector<torch::Tensor> some_parameters(const torch::Device& device) {
  std::vector<torch::Tensor> params = {
      torch::randn({16, 8, 3, 3}).contiguous(at::MemoryFormat::ChannelsLast), torch::randn({10, 24}),
      torch::randn({10}), torch::randn({7, 5, 1, 1}), torch::randn({1})};
  for (auto& p : params) p = p.to(device).requires_grad_(true);
  return params;
}

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && torch::equal(a.cpu(), b.cpu());
}

// Casts and gradients of cast_parameters against per-parameter .to(dtype), for the same upstream gradients; the
// third parameter's cast is left unused, so that it gets no gradient either way.
void compare_with_per_parameter_casts(const torch::Device& device, c10::ScalarType dtype, bool allow_fused) {
  const std::string what = std::string(c10::toString(dtype)) + " on " + device.str();
  torch::manual_seed(3);
  const auto grouped = some_parameters(device);
  std::vector<torch::Tensor> reference;
  for (const auto& p : grouped) reference.push_back(p.detach().clone().requires_grad_(true));
  const auto casts = cast_parameters(grouped, dtype, allow_fused);
  ASSERT_EQ(casts.size(), grouped.size());
  torch::Tensor loss_grouped = torch::zeros({}, torch::device(device)), loss_reference = loss_grouped.clone();
  for (size_t i = 0; i < grouped.size(); ++i) {
    const auto want = reference[i].to(dtype);
    EXPECT_TRUE(bitwise_equal(casts[i], want)) << what << ": cast " << i;
    EXPECT_EQ(casts[i].strides(), grouped[i].strides()) << what << ": cast " << i;
    if (i == 2) continue;
    const auto upstream = torch::randn(want.sizes(), torch::device(device)).to(dtype);
    loss_grouped = loss_grouped + (casts[i] * upstream).sum().to(torch::kFloat);
    loss_reference = loss_reference + (want * upstream).sum().to(torch::kFloat);
  }
  loss_grouped.backward();
  loss_reference.backward();
  for (size_t i = 0; i < grouped.size(); ++i) {
    if (i == 2) {
      EXPECT_FALSE(grouped[i].grad().defined()) << what << ": an unused cast gave its parameter a gradient";
      continue;
    }
    ASSERT_TRUE(grouped[i].grad().defined()) << what << ": parameter " << i;
    EXPECT_TRUE(bitwise_equal(grouped[i].grad(), reference[i].grad())) << what << ": gradient " << i;
    EXPECT_EQ(grouped[i].grad().strides(), grouped[i].strides()) << what << ": gradient " << i;
  }
}

TEST(ParameterCast, CastsAndGradientsMatchPerParameterCasts) {
  for (const auto dtype : {torch::kBFloat16, torch::kHalf}) compare_with_per_parameter_casts(torch::kCPU, dtype, false);
}

// A 1x1 convolution's weight keeps strides (C, 1, 1, 1) (it is channels-last contiguous as it is), while cuDNN hands
// its gradient strides (C, 1, C, C): the same memory. The backward casts that gradient back as it lies (one
// aten::copy_, the cast itself; no empty_strided and copy into the parameter's strides first), in the parameter's
// strides, bit for bit.
TEST(ParameterCast, GradientsInOtherSizeOneStridesAreNotCopiedFirst) {
  static int copies = 0, strided_empties = 0;
  const auto count = [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
    const std::string name = fn.name();
    if (name == "aten::copy_") ++copies;
    if (name == "aten::empty_strided") ++strided_empties;
    return nullptr;
  };
  const auto param = torch::randn({8, 4, 1, 1}).contiguous(at::MemoryFormat::ChannelsLast).requires_grad_(true);
  ASSERT_EQ(param.strides(), (std::vector<int64_t>{4, 1, 1, 1}));
  const auto cast = cast_parameters({param}, torch::kBFloat16, /*allow_fused=*/true);
  auto grad = at::empty({8, 4, 1, 1}, torch::TensorOptions().dtype(torch::kBFloat16), at::MemoryFormat::ChannelsLast);
  grad.normal_();
  ASSERT_EQ(grad.strides(), (std::vector<int64_t>{4, 1, 4, 4}));
  const auto handle = at::addGlobalCallback(at::RecordFunctionCallback(+count));
  torch::autograd::backward({cast[0]}, {grad});
  at::removeCallback(handle);
  EXPECT_EQ(copies, 1) << "the cast alone";
  EXPECT_EQ(strided_empties, 0);
  ASSERT_TRUE(param.grad().defined());
  EXPECT_EQ(param.grad().strides(), param.strides());
  EXPECT_TRUE(bitwise_equal(param.grad(), grad.to(torch::kFloat)));
}

TEST(ParameterCast, RefusesParametersOfTwoDtypes) {
  const std::vector<torch::Tensor> mixed = {torch::randn({4}), torch::randn({4}, torch::kDouble)};
  EXPECT_THROW(cast_parameters(mixed, torch::kBFloat16, false), std::exception);
}

TEST(ParameterCastScope, CastsUnderAutocastOnlyAndNests) {
  auto weight = torch::randn({4, 4}).requires_grad_(true);
  auto other = torch::randn({3}).requires_grad_(true);
  const auto counts = torch::zeros({2}, torch::kLong);
  {
    const ParameterCastScope off({weight}, torch::kCPU, false);
    EXPECT_EQ(off.size(), 0u);
    EXPECT_TRUE(ParameterCastScope::cast_of(weight).is_same(weight)) << "a cast without autocast";
  }
  ptrain::compat::set_autocast_dtype(c10::DeviceType::CPU, torch::kBFloat16);
  ptrain::compat::set_autocast_enabled(c10::DeviceType::CPU, true);
  {
    const ParameterCastScope outer({weight, counts}, torch::kCPU, false);
    EXPECT_EQ(outer.size(), 1u) << "an integer buffer is no autocast cast";
    EXPECT_EQ(ParameterCastScope::cast_of(weight).scalar_type(), torch::kBFloat16);
    {
      const ParameterCastScope inner({other}, torch::kCPU, false);
      EXPECT_EQ(ParameterCastScope::cast_of(other).scalar_type(), torch::kBFloat16);
      EXPECT_EQ(ParameterCastScope::cast_of(weight).scalar_type(), torch::kBFloat16) << "the outer scope's cast";
    }
    EXPECT_TRUE(ParameterCastScope::cast_of(other).is_same(other)) << "the inner scope outlived itself";
  }
  EXPECT_TRUE(ParameterCastScope::cast_of(weight).is_same(weight));
  {
    const auto frozen = torch::randn({2, 2});
    const ParameterCastScope scope({weight, frozen}, torch::kCPU, false);
    EXPECT_EQ(scope.size(), 1u) << "a frozen parameter, while gradients are recorded, keeps autocast's own cast";
    torch::NoGradGuard no_grad;
    const ParameterCastScope evaluation({weight, frozen}, torch::kCPU, false);
    EXPECT_EQ(evaluation.size(), 2u);
  }
  ptrain::compat::set_autocast_enabled(c10::DeviceType::CPU, false);
  ptrain::compat::clear_autocast_cache();
}

// CPU bf16 autocast while alive, and its cache cleared at the end, as the trainer's region does.
struct CpuAutocast {
  CpuAutocast() {
    ptrain::compat::set_autocast_dtype(c10::DeviceType::CPU, torch::kBFloat16);
    ptrain::compat::set_autocast_enabled(c10::DeviceType::CPU, true);
  }
  ~CpuAutocast() {
    ptrain::compat::set_autocast_enabled(c10::DeviceType::CPU, false);
    ptrain::compat::clear_autocast_cache();
  }
};

// Two models of the same parameters: the first with the fused path on (its weights cast as groups), the second off.
template <typename M, typename Options>
std::pair<std::shared_ptr<M>, std::shared_ptr<M>> grouped_and_plain(const Options& options) {
  auto grouped = std::make_shared<M>(options);
  auto plain = std::make_shared<M>(options);
  {
    torch::NoGradGuard no_grad;
    const auto from = grouped->parameters();
    const auto to = plain->parameters();
    for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  }
  grouped->set_fused_kernels(true);
  plain->set_fused_kernels(false);
  return {grouped, plain};
}

// A ResNet training step under CPU bf16 autocast, its units' weights cast as groups (fused kernels on) and by
// autocast itself (off): the same loss and gradients, bit for bit, and the groups in the graph.
TEST(ParameterCastScope, ResNetStepUnderAutocastMatchesAutocastsOwnCasts) {
  ptrain::models::ResNetOptions options;
  options.depth = 18;
  options.num_classes = 10;
  torch::manual_seed(7);
  const auto [grouped, plain] = grouped_and_plain<ptrain::models::ResNet>(options);
  const auto x = torch::randn({2, 3, 64, 64});
  const auto labels = torch::tensor({1, 7});
  const auto step = [&](ptrain::models::ResNet& model) {
    const CpuAutocast autocast;
    return torch::cross_entropy_loss(model.forward(x).to(torch::kFloat), labels);
  };
  const auto loss_grouped = step(*grouped);
  const auto loss_plain = step(*plain);
  // The groups, and the casts autograd takes back to a parameter (through a transposition, as LibTorch 1.13's
  // linear casts the transposed weight): autocast's own, one a weight.
  const auto count = [](const torch::Tensor& loss, size_t* groups, size_t* own_casts) {
    for_each_autograd_function(loss, [&](const torch::autograd::Node& node, const std::string& name) {
      if (ends_with(name, "CastParameters")) ++*groups;
      if (name.find("ToCopyBackward") == std::string::npos) return;
      for (const auto& edge : node.next_edges()) {
        const torch::autograd::Node* next = edge.function.get();
        if (next && next->name().find("TBackward") != std::string::npos && next->next_edges().size() == 1)
          next = next->next_edges()[0].function.get();
        if (next && ends_with(next->name(), "AccumulateGrad")) ++*own_casts;
      }
    });
  };
  size_t groups = 0, own_casts = 0, plain_groups = 0, plain_own_casts = 0;
  count(loss_grouped, &groups, &own_casts);
  count(loss_plain, &plain_groups, &plain_own_casts);
  EXPECT_EQ(groups, 10u) << "the stem, eight blocks and the head, each one group";
  EXPECT_EQ(own_casts, 0u) << "a layer took autocast's cast of its weight, not its group's";
  EXPECT_EQ(plain_groups, 0u);
  EXPECT_EQ(plain_own_casts, 22u) << "ResNet-18: 20 convolutions, the head's weight and bias";
  loss_grouped.backward();
  loss_plain.backward();
  EXPECT_TRUE(torch::equal(loss_grouped, loss_plain));
  const auto named_grouped = grouped->named_parameters();
  const auto named_plain = plain->named_parameters();
  for (const auto& item : named_grouped) {
    const auto& g = item.value().grad();
    const auto& want = named_plain[item.key()].grad();
    ASSERT_TRUE(g.defined() && want.defined()) << item.key();
    EXPECT_TRUE(torch::equal(g, want)) << item.key() << ": gradients differ";
    EXPECT_EQ(g.strides(), item.value().strides()) << item.key();
  }
}

// The grouped casts (CastParameters functions) in out's autograd graph.
size_t cast_groups(const torch::Tensor& out) {
  size_t groups = 0;
  for_each_autograd_function(out, [&](const torch::autograd::Node&, const std::string& name) {
    if (ends_with(name, "CastParameters")) ++groups;
  });
  return groups;
}

// --skip-fusions weight-casts: with the fused kernels on, ResNet's units and GPT's blocks leave their weights to
// autocast's own casts; skipping another fusion leaves the groups in place.
TEST(ParameterCastScope, SkippingWeightCastsLeavesAutocastsOwn) {
  namespace models = ptrain::models;
  models::ResNetOptions resnet_options;
  resnet_options.depth = 18;
  resnet_options.num_classes = 10;
  models::GptOptions gpt_options;
  gpt_options.layers = 2;
  const auto x = torch::randn({2, 3, 32, 32});
  const auto tokens = torch::randint(gpt_options.vocab_size, {2, 8}, torch::kLong);
  for (const bool skip : {true, false}) {
    const auto choices = models::fusions_skipping({skip ? "weight-casts" : "residual-twins"});
    models::ResNet resnet(resnet_options);
    models::Gpt gpt(gpt_options);
    for (models::Model* model : {static_cast<models::Model*>(&resnet), static_cast<models::Model*>(&gpt)}) {
      model->set_fused_kernels(true);
      model->set_fusions(choices);
    }
    const CpuAutocast autocast;
    EXPECT_EQ(cast_groups(resnet.forward(x)), skip ? 0u : 10u) << (skip ? "skipped" : "kept");
    EXPECT_EQ(cast_groups(gpt.forward(tokens)), skip ? 0u : 2u) << (skip ? "skipped" : "kept");
  }
}

TEST(ParameterCastScope, FusionNamesAreCheckedAndMapped) {
  namespace models = ptrain::models;
  const auto none = models::fusions_skipping({});
  EXPECT_TRUE(none.weight_casts && none.shortcut_norms && none.stem_pool && none.residual_twins);
  const auto some = models::fusions_skipping({"stem-pool", "shortcut-norms"});
  EXPECT_TRUE(some.weight_casts && !some.shortcut_norms && !some.stem_pool && some.residual_twins &&
              some.bias_gradients);
  EXPECT_FALSE(models::fusions_skipping({"bias-gradients"}).bias_gradients);
  EXPECT_THROW(models::fusions_skipping({"weight_casts"}), ptrain::Error);
  // What each model has: a ResNet's stem pooling with the ImageNet stem only, its twins without checkpointing.
  models::ResNetOptions imagenet;
  imagenet.depth = 18;
  models::ResNetOptions cifar = imagenet;
  cifar.cifar_stem = true;
  models::ResNet with_pool(imagenet), without_pool(cifar);
  EXPECT_EQ(with_pool.fusions(),
            (std::vector<std::string>{"weight-casts", "shortcut-norms", "stem-pool", "residual-twins"}));
  without_pool.set_activation_checkpointing(true);
  EXPECT_EQ(without_pool.fusions(), (std::vector<std::string>{"weight-casts", "shortcut-norms"}));
  models::GptOptions gpt_options;
  gpt_options.layers = 1;
  models::Gpt gpt(gpt_options);
  EXPECT_EQ(gpt.fusions(), (std::vector<std::string>{"weight-casts", "bias-gradients", "fp8-amax", "residual-adds"}));
  gpt.set_activation_checkpointing(true);
  EXPECT_EQ(gpt.fusions(), (std::vector<std::string>{"weight-casts", "bias-gradients", "fp8-amax"}));
  // A training step on the CPU takes no convolution + statistics graph (CUDA only), so no fusion is bypassed by one,
  // with --conv-bn-fusion on or off; the fp16 case where every block takes it is ConvBatchNormFusion's, on a GPU.
  for (bool conv_bn : {false, true}) {
    with_pool.set_fused_kernels(true);
    with_pool.set_conv_bn_fusion(conv_bn);
    with_pool.train();
    with_pool.forward(torch::randn({2, 3, 32, 32})).sum().backward();
    EXPECT_TRUE(with_pool.fusions_bypassed().empty()) << "conv-bn-fusion " << conv_bn;
  }
}

// GPT's blocks under CPU bf16 autocast with the fused path on (which on the CPU changes nothing else): each block's
// linear layers take one group's casts, and the loss and gradients are the unfused model's bit for bit.
TEST(ParameterCastScope, GptBlocksTakeTheirGroupsCasts) {
  ptrain::models::GptOptions options;
  options.layers = 2;
  torch::manual_seed(5);
  const auto [grouped, plain] = grouped_and_plain<ptrain::models::Gpt>(options);
  const auto tokens = torch::randint(options.vocab_size, {2, 16}, torch::kLong);
  const auto logits_of = [&](ptrain::models::Gpt& model) {
    const CpuAutocast autocast;
    return model.forward(tokens).to(torch::kFloat);
  };
  const auto step = [&](ptrain::models::Gpt& model) {
    auto loss = torch::cross_entropy_loss(logits_of(model).view({-1, options.vocab_size}), tokens.view({-1}));
    loss.backward();
    return loss.item<double>();
  };
  EXPECT_EQ(cast_groups(logits_of(*grouped)), 2u) << "one group a block";
  const double loss_grouped = step(*grouped), loss_plain = step(*plain);
  EXPECT_EQ(loss_grouped, loss_plain);
  const auto plain_parameters = plain->named_parameters();
  for (const auto& p : grouped->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(torch::equal(p.value().grad(), plain_parameters[p.key()].grad())) << p.key() << ": gradients differ";
  }
}

TEST(ParameterCast, OneKernelCastMatchesLibTorchOnTheGpu) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  const torch::Device cuda(torch::kCUDA, 0);
  for (const auto dtype : {torch::kBFloat16, torch::kHalf}) compare_with_per_parameter_casts(cuda, dtype, true);
  // More tensors than one launch takes (32), empty and of every size up to a few blocks, with fp32 subnormals and values
  // that round to the 16-bit types' subnormals, infinities and NaN: the kernel flushes nothing.
  torch::manual_seed(11);
  std::vector<torch::Tensor> params;
  for (int i = 0; i < 70; ++i) {
    auto p = torch::randn({i == 41 ? 0 : i * 37 + 1}) * std::pow(10.0, (i % 9) - 4);  // one empty tensor
    if (i % 5 == 0) p.index_put_({0}, 1e-40f);
    if (i % 7 == 0) p.index_put_({torch::indexing::Slice(0, std::min<int64_t>(3, p.numel()))}, std::nanf(""));
    if (i % 11 == 0) p.index_put_({-1}, 1e30f);
    params.push_back(p.to(cuda).requires_grad_(true));
  }
  for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
    const auto casts = cast_parameters(params, dtype, true);
    std::vector<torch::Tensor> upstream;
    for (size_t i = 0; i < params.size(); ++i) {
      const auto want = params[i].detach().to(dtype);
      EXPECT_TRUE(torch::equal(torch::isnan(casts[i]), torch::isnan(want)) &&
                  torch::equal(casts[i].nan_to_num(0), want.nan_to_num(0)))
          << c10::toString(dtype) << ": cast " << i;
      upstream.push_back(torch::randn(want.sizes(), torch::device(cuda)).to(dtype) * 1e-4);
    }
    for (auto& p : params) p.mutable_grad().reset();
    torch::autograd::backward(casts, upstream);
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_TRUE(bitwise_equal(params[i].grad(), upstream[i].to(torch::kFloat))) << c10::toString(dtype) << ": gradient " << i;
  }
}

}  // namespace
