// Fused batch norm + ReLU (+ residual) against LibTorch's batch_norm, add and relu in training mode: the
// output, the running statistics and the gradients of x, the residual, weight and bias, in every dtype, for
// ResNet's channel counts and an odd spatial size.
#include <gtest/gtest.h>

#include "gpu.h"
#include "ptrain/kernels/batch_norm_relu.h"

namespace {

using ptrain::kernels::batch_norm_relu;
using ptrain::kernels::reference_batch_norm_relu;

struct Inputs {
  torch::Tensor x, residual, weight, bias, running_mean, running_var;
};

Inputs make(int64_t n, int64_t c, int64_t hw, torch::ScalarType dtype, torch::ScalarType param, bool residual) {
  const torch::Device cuda(torch::kCUDA, 0);
  const auto cl = at::MemoryFormat::ChannelsLast;
  Inputs in;
  // An offset mean, so the variance is small beside the mean squared (what naive sums get wrong).
  in.x = (torch::randn({n, c, hw, hw}, torch::device(cuda)) * 2 + 3).to(dtype).contiguous(cl);
  if (residual) in.residual = torch::randn({n, c, hw, hw}, torch::device(cuda)).to(dtype).contiguous(cl);
  in.weight = (torch::rand({c}, torch::device(cuda)) + 0.5).to(param);
  in.bias = (torch::randn({c}, torch::device(cuda)) * 0.1).to(param);
  in.running_mean = (torch::randn({c}, torch::device(cuda)) * 0.1).to(param);
  in.running_var = (torch::rand({c}, torch::device(cuda)) + 0.5).to(param);
  return in;
}

void compare(int64_t n, int64_t c, int64_t hw, torch::ScalarType dtype, torch::ScalarType param, bool with_residual) {
  const std::string what = std::to_string(n) + "x" + std::to_string(c) + "x" + std::to_string(hw) + "x" +
                           std::to_string(hw) + " " + c10::toString(dtype) + " params " + c10::toString(param) +
                           (with_residual ? " + residual" : "");
  const Inputs base = make(n, c, hw, dtype, param, with_residual);
  const auto run = [&](bool fused, Inputs& in) {
    in.x = base.x.clone().requires_grad_(true);
    if (with_residual) in.residual = base.residual.clone().requires_grad_(true);
    in.weight = base.weight.clone().requires_grad_(true);
    in.bias = base.bias.clone().requires_grad_(true);
    in.running_mean = base.running_mean.clone();
    in.running_var = base.running_var.clone();
    auto y = fused ? batch_norm_relu(in.x, in.residual, in.weight, in.bias, in.running_mean, in.running_var, 0.1,
                                     1e-5, true)
                   : reference_batch_norm_relu(in.x, in.residual, in.weight, in.bias, in.running_mean,
                                               in.running_var, 0.1, 1e-5);
    // A gradient that is not channels-last, as one arriving from a reshaping layer can be.
    const auto dy = torch::randn_like(y, at::MemoryFormat::Contiguous);
    y.backward(dy);
    return y;
  };
  ASSERT_TRUE(ptrain::kernels::fused_batch_norm_relu_applies(base.x, base.residual, base.weight, base.running_mean))
      << what;
  Inputs f, r;
  torch::manual_seed(11);
  const auto y_fused = run(true, f);
  torch::manual_seed(11);
  const auto y_ref = run(false, r);
  const double out_tol = dtype == torch::kFloat ? 1e-5 : dtype == torch::kHalf ? 2e-3 : 1e-2;
  const double grad_tol = dtype == torch::kFloat ? 1e-4 : 3e-2;
  EXPECT_TRUE(y_fused.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
  EXPECT_LT(relative_error(y_fused, y_ref), out_tol) << what << ": y";
  EXPECT_LT(relative_error(f.running_mean, r.running_mean), 1e-4) << what << ": running_mean";
  EXPECT_LT(relative_error(f.running_var, r.running_var), 1e-4) << what << ": running_var";
  EXPECT_LT(relative_error(f.x.grad(), r.x.grad()), grad_tol) << what << ": dx";
  if (with_residual) EXPECT_LT(relative_error(f.residual.grad(), r.residual.grad()), out_tol) << what << ": dresidual";
  EXPECT_LT(relative_error(f.weight.grad(), r.weight.grad()), grad_tol) << what << ": dweight";
  EXPECT_LT(relative_error(f.bias.grad(), r.bias.grad()), grad_tol) << what << ": dbias";
}

TEST(FusedBatchNormRelu, MatchesLibTorchInEveryDtypeAndShape) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  torch::manual_seed(9);
  for (const auto dtype : {torch::kBFloat16, torch::kHalf, torch::kFloat}) {
    for (const bool residual : {false, true}) {
      compare(4, 64, 7, dtype, torch::kFloat, residual);
      compare(8, 256, 14, dtype, torch::kFloat, residual);
      compare(2, 2048, 7, dtype, torch::kFloat, residual);
      compare(3, 24, 9, dtype, torch::kFloat, residual);  // channels not a multiple of the 8 lanes of a warp
    }
  }
  compare(16, 128, 28, torch::kBFloat16, torch::kBFloat16, true);  // pure bf16: parameters in bf16 too
  compare(128, 64, 56, torch::kBFloat16, torch::kFloat, false);  // ResNet-50's layer1 at batch 128
}

TEST(FusedBatchNormRelu, RefusesWhatTheKernelsCannotTake) {
  const auto x = torch::randn({2, 6, 4, 4});
  const auto w = torch::ones({6});
  EXPECT_FALSE(ptrain::kernels::fused_batch_norm_relu_applies(x, {}, w, w));  // CPU, and 6 channels
  if (!torch::cuda::is_available()) return;
  const torch::Device cuda(torch::kCUDA, 0);
  const auto nchw = torch::randn({2, 64, 4, 4}, torch::device(cuda)).to(torch::kBFloat16);
  const auto w64 = torch::ones({64}, torch::device(cuda));
  EXPECT_FALSE(ptrain::kernels::fused_batch_norm_relu_applies(nchw, {}, w64, w64));  // not channels-last
  EXPECT_TRUE(ptrain::kernels::fused_batch_norm_relu_applies(nchw.contiguous(at::MemoryFormat::ChannelsLast), {}, w64, w64));
}

}  // namespace
