// The linear layer with the fused bias gradient (and GELU's backward), kernels/linear.h, against LibTorch's
// linear and gelu: the output, and the gradients of x, the weight and the bias; the bias gradient also against
// the column sums in fp64. The fused path must have run (its autograd function in the graph), and its bias
// gradients must come out the same on every run.
#include <gtest/gtest.h>

#include "gpu.h"
#include "ptrain/kernels/fused.h"
#include "ptrain/kernels/linear.h"
#include "ptrain/models/gpt.h"
#include "ptrain/precision/autocast_guard.h"

namespace {

using ptrain::kernels::LinearActivation;

struct Grads {
  torch::Tensor y, dx, dw, db;
};

Grads run(const torch::Tensor& x0, const torch::Tensor& w0, const torch::Tensor& b0, const torch::Tensor& dy,
          LinearActivation activation, bool fused) {
  auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
  auto y = fused ? ptrain::kernels::linear(x, w, b, activation, true)
                 : ptrain::kernels::reference_linear(x, w, b, activation);
  if (fused) {
    const auto found = autograd_functions(y, {"FusedLinear"});
    EXPECT_EQ(found.count("FusedLinear"), 1u) << "the fused path did not run";
  }
  y.backward(dy);
  return {y.detach(), x.grad(), w.grad(), b.grad()};
}

void compare(at::IntArrayRef x_shape, int64_t out, torch::ScalarType dtype, LinearActivation activation) {
  const torch::Device cuda(torch::kCUDA, 0);
  const bool gelu = activation == LinearActivation::kGeluTanh;
  const std::string what = c10::str(x_shape) + " -> " + std::to_string(out) + " " + c10::toString(dtype) +
                           (gelu ? " gelu" : "");
  const int64_t in = x_shape.back();
  const auto x = torch::randn(x_shape, torch::device(cuda)).to(dtype);
  const auto w = (torch::randn({out, in}, torch::device(cuda)) / std::sqrt(static_cast<double>(in))).to(dtype);
  const auto b = (torch::randn({out}, torch::device(cuda)) * 0.1).to(dtype);
  std::vector<int64_t> y_shape(x_shape.begin(), x_shape.end());
  y_shape.back() = out;
  const auto dy = torch::randn(y_shape, torch::device(cuda)).to(dtype);
  ASSERT_TRUE(ptrain::kernels::fused_linear_applies(x, w, b)) << what;

  const Grads f = run(x, w, b, dy, activation, true), r = run(x, w, b, dy, activation, false);
  // The forward is LibTorch's own; without GELU so are the products of the backward.
  EXPECT_TRUE(torch::equal(f.y, r.y)) << what << ": y";
  const double tol = dtype == torch::kFloat ? 1e-5 : dtype == torch::kHalf ? 2e-3 : 1e-2;
  EXPECT_LT(relative_error(f.dx, r.dx), gelu ? tol : 1e-7) << what << ": dx";
  EXPECT_LT(relative_error(f.dw, r.dw), gelu ? tol : 1e-7) << what << ": dweight";
  EXPECT_LT(relative_error(f.db, r.db), tol) << what << ": dbias";
  EXPECT_EQ(f.db.scalar_type(), dtype) << what;

  // The bias gradient against fp64 column sums of what reaches the product's output.
  torch::Tensor dh = dy.to(torch::kDouble);
  if (gelu) {
    auto h = torch::linear(x.to(torch::kDouble), w.to(torch::kDouble), b.to(torch::kDouble)).requires_grad_(true);
    torch::gelu(h, "tanh").backward(dh);
    dh = h.grad();
  }
  const auto want = dh.reshape({-1, out}).sum(0);
  EXPECT_LT(relative_error(f.db, want), dtype == torch::kFloat ? 1e-5 : 1e-2) << what << ": dbias against fp64";

  // Fixed order: the same bits on a second run.
  const Grads again = run(x, w, b, dy, activation, true);
  EXPECT_TRUE(torch::equal(again.db, f.db)) << what << ": the bias gradient differs between runs";
}

TEST(FusedLinear, MatchesLibTorch) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  torch::manual_seed(21);
  for (const auto activation : {LinearActivation::kNone, LinearActivation::kGeluTanh}) {
    for (const auto dtype : {torch::kBFloat16, torch::kHalf, torch::kFloat}) {
      compare({4, 512, 256}, 1024, dtype, activation);  // a GPT block's shapes, smaller
      compare({3, 7, 40}, 24, dtype, activation);       // 21 rows: one chunk, part of a tile
      compare({4100, 16}, 8, dtype, activation);        // many chunks, the last one short
    }
  }
}

// The fused tier's own column sums on inputs the kernels must copy first (not 16-byte aligned) and on many rows.
TEST(FusedLinear, BiasGradientOfAnUnalignedView) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  const torch::Device cuda(torch::kCUDA, 0);
  torch::manual_seed(22);
  for (const auto dtype : {torch::kBFloat16, torch::kFloat}) {
    const int64_t rows = 70000, cols = 72;
    const auto buffer = torch::randn({rows * cols + 1}, torch::device(cuda)).to(dtype);
    const auto grad = buffer.narrow(0, 1, rows * cols).view({rows, cols});
    ASSERT_NE(reinterpret_cast<uintptr_t>(grad.data_ptr()) % 16, 0u);
    const auto got = ptrain::kernels::fused::bias_gradient(grad, torch::kFloat);
    const auto want = grad.to(torch::kDouble).sum(0);
    EXPECT_LT(relative_error(got, want), 1e-5) << c10::toString(dtype);
  }
}

// A GPT on the GPU in amp-bf16, with every fusion and with --skip-fusions bias-gradients,residual-adds, from the same
// weights: the deferred residual adds compute the same fp32 sums, so the logits and the loss are the same bits; the
// gradients differ by the bias sums' order of addition alone (bf16 rounding).
TEST(FusedLinear, GptStepsMatchWithoutTheNewFusions) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  ptrain::models::GptOptions o;
  o.vocab_size = 256;
  o.seq_len = 32;
  o.layers = 3;
  o.width = 128;
  o.heads = 4;
  const auto tokens = torch::randint(256, {4, 33}, torch::device(torch::kCUDA).dtype(torch::kLong));
  struct Step {
    torch::Tensor logits;
    std::vector<torch::Tensor> grads;
  };
  const auto step = [&](bool new_fusions) {
    torch::manual_seed(23);
    auto gpt = std::make_shared<ptrain::models::Gpt>(o);
    gpt->to(torch::kCUDA);
    gpt->set_fused_kernels(true);
    if (!new_fusions) gpt->set_fusions(ptrain::models::fusions_skipping({"bias-gradients", "residual-adds"}));
    gpt->train();
    Step out;
    torch::Tensor loss;
    {
      ptrain::precision::AutocastGuard autocast(c10::DeviceType::CUDA, true, torch::kBFloat16);
      out.logits = gpt->forward(tokens.narrow(1, 0, 32));
      loss = torch::cross_entropy_loss(out.logits.reshape({-1, out.logits.size(-1)}).to(torch::kFloat),
                                       tokens.narrow(1, 1, 32).reshape({-1}));
      if (new_fusions) {
        const auto found = autograd_functions(loss, {"FusedLinear", "FusedAddLayerNorm"});
        EXPECT_EQ(found.size(), 2u) << "the fused linear layers and add + LayerNorm ran";
      }
    }
    loss.backward();
    for (const auto& p : gpt->parameters()) out.grads.push_back(p.grad());
    return out;
  };
  const Step with = step(true), without = step(false);
  EXPECT_TRUE(torch::equal(with.logits, without.logits));
  ASSERT_EQ(with.grads.size(), without.grads.size());
  for (size_t i = 0; i < with.grads.size(); ++i) {
    ASSERT_TRUE(with.grads[i].defined() && without.grads[i].defined()) << "parameter " << i;
    EXPECT_LT(relative_error(with.grads[i], without.grads[i]), 2e-2) << "parameter " << i;
  }
}

TEST(FusedLinear, RefusesWhatTheKernelsCannotTake) {
  const auto x = torch::randn({4, 16});
  EXPECT_FALSE(ptrain::kernels::fused_linear_applies(x, torch::randn({8, 16}), torch::randn({8})));  // CPU
  if (!torch::cuda::is_available() || !ptrain::kernels::fused_kernels_available(torch::Device(torch::kCUDA, 0)))
    return;
  const auto on = torch::device(torch::Device(torch::kCUDA, 0));
  const auto xc = torch::randn({4, 16}, on);
  EXPECT_TRUE(ptrain::kernels::fused_linear_applies(xc, torch::randn({8, 16}, on), torch::randn({8}, on)));
  EXPECT_FALSE(ptrain::kernels::fused_linear_applies(xc, torch::randn({12, 16}, on), torch::randn({12}, on)));  // 12 outputs
  EXPECT_FALSE(ptrain::kernels::fused_linear_applies(xc, torch::randn({8, 16}, on), torch::Tensor()));        // no bias
  EXPECT_FALSE(ptrain::kernels::fused_linear_applies(xc.to(torch::kBFloat16), torch::randn({8, 16}, on),
                                                     torch::randn({8}, on)));  // mixed dtypes
}

}  // namespace
