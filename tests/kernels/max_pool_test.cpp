// The fused max pooling against torch::max_pool2d: outputs and input gradients bit for bit, on data full of ties
// (a ReLU's zeros, values rounded to a few levels) and with NaNs, in every dtype, for ResNet's stem and odd sizes.
#include <cmath>

#include <gtest/gtest.h>

#include "gpu.h"
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
