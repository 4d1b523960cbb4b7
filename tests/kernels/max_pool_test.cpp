// The fused max pooling against torch::max_pool2d: outputs and input gradients bit for bit, on data full of ties
// (a ReLU's zeros, values rounded to a few levels) and with NaNs, in every dtype, for ResNet's stem and odd
// sizes; and the stem's batch norm + ReLU + max pooling as one function against the two it replaces.
#include <cmath>

#include <gtest/gtest.h>

#include "batch_norm_inputs.h"
#include "gpu.h"
#include "ptrain/kernels/batch_norm_relu.h"
#include "ptrain/kernels/fused.h"
#include "ptrain/kernels/max_pool.h"

namespace {

using ptrain::kernels::fused_max_pool2d_applies;
using ptrain::kernels::max_pool2d;

void compare_pool(int64_t n, int64_t c, int64_t h, int64_t w, int64_t kernel, int64_t stride, int64_t padding,
             torch::ScalarType dtype, bool with_nan) {
  const std::string what = std::to_string(n) + "x" + std::to_string(c) + "x" + std::to_string(h) + "x" +
                           std::to_string(w) + " pool " + std::to_string(kernel) + "/" + std::to_string(stride) + "/" +
                           std::to_string(padding) + " " + c10::toString(dtype) + (with_nan ? " with NaNs" : "");
  const torch::Device cuda(torch::kCUDA, 0);
  // After a ReLU about half the values are zero; rounded to quarters, many windows tie among the rest too.
  auto base = torch::relu(torch::round(torch::randn({n, c, h, w}, torch::device(cuda)) * 4) / 4);
  if (with_nan) base.view(-1).index_put_({torch::randint(base.numel(), {8}, torch::device(cuda).dtype(torch::kLong))},
                                         std::nan(""));
  base = base.to(dtype).contiguous(at::MemoryFormat::ChannelsLast);
  ASSERT_TRUE(fused_max_pool2d_applies(base, kernel, stride, padding)) << what;
  const auto run = [&](bool fused) {
    auto x = base.detach().clone().requires_grad_(true);
    auto y = max_pool2d(x, kernel, stride, padding, fused);
    if (fused) { EXPECT_NE(y.grad_fn()->name().find("FusedMaxPool2d"), std::string::npos) << what; }
    torch::manual_seed(5);
    y.backward(torch::randn(y.sizes(), y.options()));
    return std::make_pair(y.detach(), x.grad());
  };
  const auto [y_fused, dx_fused] = run(true);
  const auto [y_ref, dx_ref] = run(false);
  EXPECT_EQ(y_fused.sizes(), y_ref.sizes()) << what;
  EXPECT_TRUE(y_fused.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
  const auto same = [](const torch::Tensor& a, const torch::Tensor& b) {
    // NaN where the other has NaN, every other value identical.
    return torch::equal(torch::isnan(a), torch::isnan(b)) &&
           torch::equal(torch::nan_to_num(a.to(torch::kFloat), 0), torch::nan_to_num(b.to(torch::kFloat), 0));
  };
  EXPECT_TRUE(same(y_fused, y_ref)) << what << ": output";
  EXPECT_TRUE(same(dx_fused, dx_ref)) << what << ": input gradient";
}

TEST(FusedMaxPool2d, MatchesLibTorchBitForBit) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  torch::manual_seed(21);
  for (const auto dtype : {torch::kBFloat16, torch::kHalf, torch::kFloat}) {
    compare_pool(4, 64, 28, 28, 3, 2, 1, dtype, false);
    compare_pool(3, 24, 9, 11, 3, 2, 1, dtype, false);  // odd, unequal sides
    compare_pool(2, 16, 12, 13, 3, 2, 1, dtype, true);  // the stem's geometry with NaNs
    compare_pool(2, 16, 7, 7, 2, 2, 0, dtype, false);   // windows that do not overlap
    compare_pool(2, 32, 10, 10, 3, 1, 1, dtype, true);  // stride 1: up to nine outputs an input; NaNs
  }
  compare_pool(128, 64, 112, 112, 3, 2, 1, torch::kBFloat16, false);  // ResNet-50's stem at batch 128
}

TEST(FusedMaxPool2d, RefusesWhatTheKernelsCannotTake) {
  EXPECT_FALSE(fused_max_pool2d_applies(torch::randn({2, 8, 6, 6}), 3, 2, 1));  // CPU
  if (!torch::cuda::is_available()) return;
  const auto x = torch::randn({2, 64, 6, 6}, torch::device(torch::kCUDA)).to(torch::kBFloat16);
  EXPECT_FALSE(fused_max_pool2d_applies(x, 3, 2, 1));  // not channels-last
  const auto cl = x.contiguous(at::MemoryFormat::ChannelsLast);
  EXPECT_FALSE(fused_max_pool2d_applies(cl, 3, 2, 2));  // padding beyond half the kernel
  EXPECT_FALSE(fused_max_pool2d_applies(cl.narrow(1, 0, 12).contiguous(at::MemoryFormat::ChannelsLast), 3, 2, 1));
  EXPECT_EQ(fused_max_pool2d_applies(cl, 3, 2, 1), ptrain::kernels::fused_kernels_available(cl.device()));
}

TEST(FusedMaxPool2d, CpuTensorsTakeLibTorchsPooling) {
  torch::manual_seed(4);
  const auto x = torch::randn({2, 8, 9, 9});
  EXPECT_TRUE(torch::equal(max_pool2d(x, 3, 2, 1, true), torch::max_pool2d(x, 3, 2, 1)));
}

}  // namespace

namespace {

using ptrain::kernels::batch_norm_relu_max_pool;
using ptrain::kernels::BatchNormParams;

// ResNet's stem as one fused function (kernels::batch_norm_relu_max_pool) against the two fused functions it
// replaces (batch norm + ReLU, then max pooling): the pooled output bit for bit (the same values, rounded alike),
// the running statistics, and the gradients of x, weight and bias to the rounding of sums taken in another order.
void compare_stem(int64_t n, int64_t c, int64_t h, int64_t w, torch::ScalarType dtype, torch::ScalarType param) {
  const std::string what = std::to_string(n) + "x" + std::to_string(c) + "x" + std::to_string(h) + "x" +
                           std::to_string(w) + " " + c10::toString(dtype) + " params " + c10::toString(param);
  const auto base = batch_norm_inputs::make(n, c, h, dtype, param, false);
  const auto x_base = (torch::randn({n, c, h, w}, base.x.options().dtype(torch::kFloat)) * 2 + 0.5)
                          .to(dtype)
                          .contiguous(at::MemoryFormat::ChannelsLast);
  struct Run {
    batch_norm_inputs::Inputs in;
    torch::Tensor y;
  };
  const auto run = [&](bool one_function) {
    Run r{batch_norm_inputs::leaves_of(base, dtype, param), {}};
    r.in.x = x_base.detach().clone().requires_grad_(true);
    const BatchNormParams bn{r.in.weight, r.in.bias, r.in.running_mean, r.in.running_var, 0.1, 1e-5};
    if (one_function) {
      r.y = batch_norm_relu_max_pool(ptrain::kernels::KernelPath::kFused, r.in.x, bn, 3, 2, 1);
      EXPECT_TRUE(ends_with(r.y.grad_fn()->name(), "FusedBatchNormReluMaxPool") ||
                  ends_with(r.y.grad_fn()->name(), "FusedBatchNormReluMaxPool>"))
          << what << ": " << r.y.grad_fn()->name();
    } else {
      const auto normalized =
          ptrain::kernels::batch_norm_relu(ptrain::kernels::KernelPath::kFused, r.in.x, torch::Tensor(), bn.weight,
                                           bn.bias, bn.running_mean, bn.running_var, 0.1, 1e-5);
      r.y = max_pool2d(normalized, 3, 2, 1, true);
    }
    torch::manual_seed(23);
    r.y.backward(torch::randn(r.y.sizes(), r.y.options()));
    return r;
  };
  ASSERT_TRUE(ptrain::kernels::fused_batch_norm_relu_max_pool_applies(
      x_base, {base.weight, base.bias, base.running_mean, base.running_var, 0.1, 1e-5}, 3, 2, 1))
      << what;
  const Run fused = run(true), apart = run(false);
  EXPECT_TRUE(fused.y.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
  EXPECT_TRUE(torch::equal(fused.y, apart.y)) << what << ": pooled output";
  const double rounding = dtype == torch::kFloat ? 1e-5 : dtype == torch::kHalf ? 2e-3 : 1e-2;
  EXPECT_LT(relative_error(fused.in.running_mean, apart.in.running_mean), 1e-6) << what;
  EXPECT_LT(relative_error(fused.in.running_var, apart.in.running_var), 1e-6) << what;
  EXPECT_LT(relative_error(fused.in.x.grad(), apart.in.x.grad()), rounding) << what << ": dx";
  EXPECT_LT(relative_error(fused.in.weight.grad(), apart.in.weight.grad()), 1e-4) << what << ": dweight";
  EXPECT_LT(relative_error(fused.in.bias.grad(), apart.in.bias.grad()), 1e-4) << what << ": dbias";
}

TEST(FusedBatchNormReluMaxPool, MatchesTheTwoFunctionsItReplaces) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  torch::manual_seed(29);
  compare_stem(4, 64, 28, 28, torch::kBFloat16, torch::kFloat);
  compare_stem(3, 24, 9, 11, torch::kBFloat16, torch::kFloat);  // odd, unequal sides
  compare_stem(2, 16, 12, 13, torch::kHalf, torch::kHalf);      // parameters in fp16
  compare_stem(2, 32, 14, 14, torch::kFloat, torch::kFloat);
  compare_stem(16, 64, 112, 112, torch::kBFloat16, torch::kFloat);  // ResNet-50's stem at batch 16
}

// At ResNet-50's stem (batch 32) both ways run as one cooperative launch.
TEST(FusedBatchNormReluMaxPool, RunsAsOneLaunchEachWayAtTheStem) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  namespace fused = ptrain::kernels::fused;
  const auto in = batch_norm_inputs::make(32, 64, 112, torch::kBFloat16, torch::kFloat, false);
  const auto forward = fused::batch_norm_relu_max_pool_forward(
      in.x, {in.weight, in.bias, in.running_mean, in.running_var, 0.1, 1e-5}, 3, 2, 1);
  EXPECT_TRUE(forward.single_pass);
  const auto backward = fused::batch_norm_relu_max_pool_backward(torch::randn_like(forward.y), forward.positions, in.x,
                                                                 forward.stats, in.weight, 3, 2, 1);
  EXPECT_TRUE(backward.single_pass);
}

}  // namespace
