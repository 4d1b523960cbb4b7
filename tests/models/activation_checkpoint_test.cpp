#include "ptrain/models/activation_checkpoint.h"

#include <gtest/gtest.h>

#include "model_test_support.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/models/resnet.h"
#include "ptrain/models/state_dict.h"

namespace {

using ptrain::models::ResNet;
using ptrain::models::ResNetOptions;
using ptrain::testing::relative_error;
using ptrain::testing::tensor_named;

struct StepResult {
  std::vector<std::pair<std::string, torch::Tensor>> grads;
  torch::Tensor input_grad;
  ptrain::io::NamedTensors state;
};

// One training forward and backward of a fresh ResNet-18 (CIFAR stem) holding `weights`.
StepResult train_step(bool checkpointing, const ptrain::io::NamedTensors& weights, const torch::Tensor& batch,
                      const torch::Tensor& labels) {
  ResNetOptions options;
  options.depth = 18;
  options.num_classes = 10;
  options.cifar_stem = true;
  ResNet model(options);
  ptrain::models::load_state_dict(model, weights, "reference weights");
  model.set_activation_checkpointing(checkpointing);
  model.train();
  auto input = batch.clone().requires_grad_(true);
  torch::nn::functional::cross_entropy(model.forward(input), labels).backward();
  StepResult result;
  for (const auto& item : model.named_parameters()) result.grads.emplace_back(item.key(), item.value().grad().clone());
  result.input_grad = input.grad().clone();
  result.state = ptrain::models::state_dict(model);
  return result;
}

TEST(ActivationCheckpoint, GradientsAndRunningStatsEqualThoseWithout) {
  torch::manual_seed(0);
  ResNetOptions options;
  options.depth = 18;
  options.num_classes = 10;
  options.cifar_stem = true;
  const auto weights = ptrain::models::state_dict(ResNet(options));
  const auto batch = torch::randn({4, 3, 32, 32});
  const auto labels = torch::randint(10, {4});

  const auto plain = train_step(false, weights, batch, labels);
  const auto checkpointed = train_step(true, weights, batch, labels);
  ASSERT_EQ(plain.grads.size(), checkpointed.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    const auto& [name, grad] = plain.grads[i];
    ASSERT_TRUE(checkpointed.grads[i].second.defined()) << name << " got no gradient";
    EXPECT_LT(relative_error(checkpointed.grads[i].second, grad), 1e-6) << name;
  }
  EXPECT_LT(relative_error(checkpointed.input_grad, plain.input_grad), 1e-6);
  for (const auto& [name, tensor] : plain.state) {
    const auto& other = tensor_named(checkpointed.state, name);
    if (name.find("num_batches_tracked") != std::string::npos) {
      EXPECT_EQ(other.item<int64_t>(), 1) << name;
      EXPECT_EQ(tensor.item<int64_t>(), 1) << name;
    } else if (name.find("running") != std::string::npos) {
      EXPECT_LT(relative_error(other, tensor), 1e-6) << name;
    }
  }
}

TEST(ActivationCheckpoint, SavesNoActivationsOfTheBlock) {
  // The output's autograd node is the checkpoint, whose only saved tensor is the input.
  auto linear = torch::nn::Linear(4, 4);
  const auto input = torch::randn({2, 4}, torch::requires_grad());
  auto out = ptrain::models::checkpoint(
      [&](const torch::Tensor& x) { return torch::relu(linear->forward(torch::tanh(x))); }, input, *linear);
  ASSERT_NE(out.grad_fn(), nullptr);
  EXPECT_EQ(out.grad_fn()->next_edges().size(), 3u);  // input, weight, bias
  out.sum().backward();
  auto expected_input = input.detach().clone().requires_grad_(true);
  auto reference = torch::nn::Linear(4, 4);
  {
    torch::NoGradGuard no_grad;
    reference->weight.copy_(linear->weight);
    reference->bias.copy_(linear->bias);
  }
  torch::relu(reference->forward(torch::tanh(expected_input))).sum().backward();
  EXPECT_TRUE(torch::allclose(input.grad(), expected_input.grad()));
  EXPECT_TRUE(torch::allclose(linear->weight.grad(), reference->weight.grad()));
  EXPECT_TRUE(torch::allclose(linear->bias.grad(), reference->bias.grad()));
}

// Forward under CPU bf16 autocast, backward outside it (as a trainer does): the recomputation must see
// bf16 autocast again, or the gradients belong to a different (fp32) forward.
TEST(ActivationCheckpoint, RecomputationRestoresAutocastState) {
  auto linear = torch::nn::Linear(8, 8);
  std::vector<c10::ScalarType> seen;
  const auto input = torch::randn({3, 8}, torch::requires_grad());
  torch::Tensor out;
  {
    ptrain::compat::set_autocast_dtype(c10::DeviceType::CPU, torch::kBFloat16);
    ptrain::compat::set_autocast_enabled(c10::DeviceType::CPU, true);
    out = ptrain::models::checkpoint(
        [&](const torch::Tensor& x) {
          auto y = linear->forward(x);
          seen.push_back(y.scalar_type());
          return y;
        },
        input, *linear);
    ptrain::compat::set_autocast_enabled(c10::DeviceType::CPU, false);
    ptrain::compat::clear_autocast_cache();
  }
  out.to(torch::kFloat).sum().backward();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], torch::kBFloat16);
  EXPECT_EQ(seen[1], torch::kBFloat16) << "the recomputation ran without the forward's autocast";
  EXPECT_FALSE(ptrain::compat::autocast_enabled(c10::DeviceType::CPU)) << "backward leaked its autocast state";
  ASSERT_TRUE(linear->weight.grad().defined());
  EXPECT_EQ(linear->weight.grad().scalar_type(), torch::kFloat);
}

TEST(ActivationCheckpoint, ResNetGradientsUnderBf16AutocastMatchWithout) {
  torch::manual_seed(0);
  ResNetOptions options;
  options.depth = 20;
  options.num_classes = 10;
  const auto weights = ptrain::models::state_dict(ResNet(options));
  const auto batch = torch::randn({2, 3, 32, 32});
  const auto labels = torch::randint(10, {2});
  std::vector<std::vector<torch::Tensor>> grads;
  for (bool checkpointing : {false, true}) {
    ResNet model(options);
    ptrain::models::load_state_dict(model, weights, "reference weights");
    model.set_activation_checkpointing(checkpointing);
    ptrain::compat::set_autocast_dtype(c10::DeviceType::CPU, torch::kBFloat16);
    ptrain::compat::set_autocast_enabled(c10::DeviceType::CPU, true);
    auto logits = model.forward(batch);
    ptrain::compat::set_autocast_enabled(c10::DeviceType::CPU, false);
    ptrain::compat::clear_autocast_cache();
    EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
    torch::nn::functional::cross_entropy(logits.to(torch::kFloat), labels).backward();
    grads.emplace_back();
    for (const auto& p : model.parameters()) grads.back().push_back(p.grad().clone());
  }
  for (size_t i = 0; i < grads[0].size(); ++i) {
    ASSERT_TRUE(grads[1][i].defined());
    // Same bf16 computation both times; a fp32 recomputation would differ at the percent level.
    EXPECT_LT(relative_error(grads[1][i], grads[0][i]), 1e-3) << "parameter " << i;
  }
}

}  // namespace
