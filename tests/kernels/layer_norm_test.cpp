// Fused residual add + LayerNorm against LibTorch's add, layer_norm and cast: both outputs and every gradient
// (x, the branch, weight, bias), with the sum used again downstream as the transformer block uses it.
#include <gtest/gtest.h>

#include "gpu.h"
#include "ptrain/kernels/layer_norm.h"

namespace {

using ptrain::kernels::add_layer_norm;
using ptrain::kernels::reference_add_layer_norm;

void compare(int64_t rows, int64_t cols, torch::ScalarType branch_dtype, torch::ScalarType out_dtype, bool with_branch) {
  const torch::Device cuda(torch::kCUDA, 0);
  const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + " branch " +
                           (with_branch ? c10::toString(branch_dtype) : "none") + " out " + c10::toString(out_dtype);
  const auto x0 = torch::randn({rows, cols}, torch::device(cuda)) * 3 + 1;
  const auto b0 = torch::randn({rows, cols}, torch::device(cuda)).to(branch_dtype);
  const auto w0 = torch::rand({cols}, torch::device(cuda)) + 0.5;
  const auto c0 = torch::randn({cols}, torch::device(cuda)) * 0.1;
  const auto dout = torch::randn({rows, cols}, torch::device(cuda)).to(out_dtype);
  const auto dsum = torch::randn({rows, cols}, torch::device(cuda));
  struct Run {
    torch::Tensor x, b, w, c, sum, out;
  };
  const auto run = [&](bool fused) {
    Run r{x0.clone().requires_grad_(true), b0.clone().requires_grad_(true), w0.clone().requires_grad_(true),
          c0.clone().requires_grad_(true), {}, {}};
    auto y = fused ? add_layer_norm(r.x, with_branch ? r.b : torch::Tensor(), r.w, r.c, 1e-5, out_dtype, true)
                   : reference_add_layer_norm(r.x, with_branch ? r.b : torch::Tensor(), r.w, r.c, 1e-5, out_dtype);
    r.sum = y.sum;
    r.out = y.out;
    // The sum feeds the next residual add as well as the norm.
    auto loss = (y.out.to(torch::kFloat) * dout.to(torch::kFloat)).sum() + (with_branch ? (y.sum * dsum).sum() : 0 * y.sum.sum());
    loss.backward();
    return r;
  };
  ASSERT_TRUE(ptrain::kernels::fused_add_layer_norm_applies(x0, with_branch ? b0 : torch::Tensor(), w0, out_dtype)) << what;
  const Run f = run(true), r = run(false);
  const double out_tol = out_dtype == torch::kFloat ? 1e-5 : out_dtype == torch::kHalf ? 2e-3 : 1e-2;
  EXPECT_EQ(f.out.scalar_type(), out_dtype) << what;
  EXPECT_LT(relative_error(f.out, r.out), out_tol) << what << ": out";
  if (with_branch) { EXPECT_LT(relative_error(f.sum, r.sum), 1e-6) << what << ": sum"; }
  EXPECT_LT(relative_error(f.x.grad(), r.x.grad()), 1e-4) << what << ": dx";
  if (with_branch) { EXPECT_LT(relative_error(f.b.grad(), r.b.grad()), branch_dtype == torch::kFloat ? 1e-4 : 1e-2) << what << ": dbranch"; }
  EXPECT_LT(relative_error(f.w.grad(), r.w.grad()), 1e-4) << what << ": dweight";
  EXPECT_LT(relative_error(f.c.grad(), r.c.grad()), 1e-4) << what << ": dbias";
}

TEST(FusedAddLayerNorm, MatchesLibTorch) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  torch::manual_seed(12);
  for (const bool with_branch : {true, false}) {
    for (const auto out : {torch::kBFloat16, torch::kHalf, torch::kFloat}) {
      compare(16 * 1024, 768, torch::kBFloat16, out, with_branch);
      compare(37, 1600, torch::kHalf, out, with_branch);
      compare(5, 8, torch::kFloat, out, with_branch);
    }
  }
}

TEST(FusedAddLayerNorm, RefusesWhatTheKernelsCannotTake) {
  const auto x = torch::randn({4, 12});
  EXPECT_FALSE(ptrain::kernels::fused_add_layer_norm_applies(x, {}, torch::ones({12}), torch::kFloat));
  if (!torch::cuda::is_available()) return;
  const torch::Device cuda(torch::kCUDA, 0);
  EXPECT_FALSE(ptrain::kernels::fused_add_layer_norm_applies(torch::randn({4, 12}, torch::device(cuda)), {},
                                                             torch::ones({12}, torch::device(cuda)), torch::kFloat));
  const auto half = torch::randn({4, 16}, torch::device(cuda)).to(torch::kBFloat16);
  EXPECT_FALSE(ptrain::kernels::fused_add_layer_norm_applies(half, {}, torch::ones({16}, torch::device(cuda)), torch::kBFloat16));
}

}  // namespace
