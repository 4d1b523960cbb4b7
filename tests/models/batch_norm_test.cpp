// ptrain's BatchNorm2d must be torch::nn::BatchNorm2d in everything but the seam it adds: the same
// state_dict entries in the same order, the same outputs, running statistics and gradients.
#include <gtest/gtest.h>

#include "ptrain/models/batch_norm.h"

namespace ptrain::models {
namespace {

struct Pair {
  torch::nn::BatchNorm2d theirs;
  BatchNorm2d ours;
};

Pair make_pair(const torch::nn::BatchNormOptions& options) {
  Pair p{torch::nn::BatchNorm2d(options), BatchNorm2d(options)};
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  if (options.affine()) {
    p.theirs->weight.uniform_(0.5, 1.5);
    p.theirs->bias.uniform_(-0.5, 0.5);
    p.ours->weight.copy_(p.theirs->weight);
    p.ours->bias.copy_(p.theirs->bias);
  }
  return p;
}

void expect_same_state(torch::nn::Module& theirs, torch::nn::Module& ours) {
  const auto a = theirs.named_parameters(), b = ours.named_parameters();
  ASSERT_EQ(a.keys(), b.keys());
  const auto c = theirs.named_buffers(), d = ours.named_buffers();
  ASSERT_EQ(c.keys(), d.keys());
  for (const auto& key : c.keys()) EXPECT_TRUE(torch::allclose(c[key].to(torch::kDouble), d[key].to(torch::kDouble), 1e-6, 1e-7)) << key;
}

void expect_same_behaviour(const torch::nn::BatchNormOptions& options) {
  auto p = make_pair(options);
  for (int step = 0; step < 3; ++step) {
    auto x1 = torch::randn({6, options.num_features(), 5, 5}) * 3 + 1;
    auto x2 = x1.detach().clone().requires_grad_();
    x1.requires_grad_();
    const auto y1 = p.theirs->forward(x1), y2 = p.ours->forward(x2);
    EXPECT_TRUE(torch::allclose(y1, y2, 1e-5, 1e-6));
    (y1 * y1).sum().backward();
    (y2 * y2).sum().backward();
    EXPECT_TRUE(torch::allclose(x1.grad(), x2.grad(), 1e-4, 1e-5));
    if (options.affine()) { EXPECT_TRUE(torch::allclose(p.theirs->weight.grad(), p.ours->weight.grad(), 1e-4, 1e-5)); }
  }
  expect_same_state(*p.theirs, *p.ours);
  p.theirs->eval();
  p.ours->eval();
  const auto x = torch::randn({2, options.num_features(), 3, 3});
  EXPECT_TRUE(torch::allclose(p.theirs->forward(x), p.ours->forward(x), 1e-5, 1e-6));
}

TEST(BatchNorm2d, BehavesAsTorchsBatchNorm2d) { expect_same_behaviour(torch::nn::BatchNormOptions(4)); }
TEST(BatchNorm2d, BehavesAsTorchsWithCumulativeMomentumAndWithoutAffine) {
  expect_same_behaviour(torch::nn::BatchNormOptions(3).momentum(c10::nullopt).affine(false));
}

// A batch with one value per channel is refused in training, as torch's BatchNorm2d refuses it, on every path;
// in evaluation the running statistics normalise it.
TEST(BatchNorm2d, RefusesOneValuePerChannelInTrainingAsTorchDoes) {
  auto p = make_pair(torch::nn::BatchNormOptions(4));
  const auto single = torch::randn({1, 4, 1, 1});
  EXPECT_THROW(p.theirs->forward(single), c10::Error);
  try {
    p.ours->forward(single);
    ADD_FAILURE() << "a channel of one value was normalised";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than 1 value per channel when training"), std::string::npos) << e.what();
  }
  EXPECT_THROW(p.ours->forward_relu(single, torch::randn({1, 4, 1, 1})), c10::Error);
  p.ours->set_fused_kernels(true);
  EXPECT_THROW(p.ours->forward_relu(single), c10::Error);
  EXPECT_NO_THROW(p.ours->forward(torch::randn({2, 4, 1, 1})));
  EXPECT_EQ(p.ours->num_batches_tracked.item<int64_t>(), 1) << "only the batch of two values counted";
  p.ours->eval();
  EXPECT_NO_THROW(p.ours->forward(single));
}

TEST(BatchNorm2d, TakeOverReplacesTheNormalisationUntilReset) {
  BatchNorm2d norm(2);
  int calls = 0;
  norm->take_over([&calls](BatchNorm2dImpl&, const torch::Tensor& x) {
    ++calls;
    return x * 0;
  });
  const auto x = torch::randn({4, 2, 2, 2});
  EXPECT_EQ(norm->forward(x).abs().sum().item<double>(), 0.0);
  EXPECT_EQ(calls, 1);
  norm->take_over(nullptr);
  EXPECT_GT(norm->forward(x).abs().sum().item<double>(), 0.0);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace ptrain::models
