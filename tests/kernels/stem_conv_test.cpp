// The stem's 7x7 stride-2 convolution as a 4x4 convolution over the input's space-to-depth (kernels/stem_conv.h)
// against torch::conv2d: in double on the CPU (outputs and weight gradients to rounding, odd sizes, both memory
// formats), the CUDA regrouping kernel against LibTorch's ops bit for bit, the bf16 form against the fp32
// convolution, and ResNet-50 taking it only where it pays (bf16 on CUDA).
#include <gtest/gtest.h>

#include "gpu.h"
#include "ptrain/core/error.h"
#include "ptrain/kernels/stem_conv.h"
#include "ptrain/models/resnet.h"
#include "ptrain/precision/autocast_guard.h"

namespace {

using ptrain::kernels::stem_conv_space_to_depth;
using ptrain::kernels::stem_space_to_depth_input;
using ptrain::kernels::stem_space_to_depth_pays;

struct Case {
  int64_t n, c, h, w;
  bool channels_last;
};

TEST(StemConv, SpaceToDepthFormIsTheSevenBySevenConvolutionInDouble) {
  for (const Case& k : {Case{2, 3, 32, 32, false}, Case{2, 3, 31, 20, true}, Case{1, 1, 9, 14, false},
                        Case{3, 4, 17, 17, true}, Case{1, 3, 7, 8, false}}) {
    const std::string what = std::to_string(k.n) + "x" + std::to_string(k.c) + "x" + std::to_string(k.h) + "x" +
                             std::to_string(k.w) + (k.channels_last ? " channels-last" : "");
    torch::manual_seed(3);
    auto x = torch::randn({k.n, k.c, k.h, k.w}, torch::kDouble);
    if (k.channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
    const auto weight = torch::randn({5, k.c, 7, 7}, torch::kDouble);
    const auto upstream = torch::randn({k.n, 5, (k.h - 1) / 2 + 1, (k.w - 1) / 2 + 1}, torch::kDouble);
    const auto run = [&](bool space_to_depth) {
      auto w = weight.clone().requires_grad_(true);
      auto y = space_to_depth ? stem_conv_space_to_depth(x, w, /*allow_fused=*/false)
                              : torch::conv2d(x, w, {}, /*stride=*/2, /*padding=*/3);
      (y * upstream).sum().backward();
      return std::make_pair(y.detach(), w.grad());
    };
    const auto [y, dw] = run(true);
    const auto [y_ref, dw_ref] = run(false);
    ASSERT_EQ(y.sizes(), y_ref.sizes()) << what;
    EXPECT_LT((y - y_ref).abs().max().item<double>(), 1e-11 * std::max(1.0, y_ref.abs().max().item<double>())) << what;
    EXPECT_LT((dw - dw_ref).abs().max().item<double>(), 1e-11 * std::max(1.0, dw_ref.abs().max().item<double>())) << what;
  }
}

TEST(StemConv, TheRegroupedInputHoldsEachPatchInItsChannelsAndZerosAround) {
  // One 1-channel 4x4 image of distinct values: output pixel (i, j) channel (s * 2 + t) holds x[2i + s - 4, 2j + t - 4].
  const auto x = torch::arange(1, 17, torch::kFloat).reshape({1, 1, 4, 4});
  const auto y = stem_space_to_depth_input(x, torch::kFloat, /*allow_fused=*/false);
  ASSERT_EQ(y.sizes(), at::IntArrayRef({1, 8, 5, 5}));  // 4 channels padded to 8; (4 - 1) / 2 + 4 = 5
  EXPECT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_EQ(y[0][0][2][2].item<float>(), 1.0f);   // x[0, 0]: i = j = 2, s = t = 0
  EXPECT_EQ(y[0][1][2][2].item<float>(), 2.0f);   // x[0, 1]: t = 1
  EXPECT_EQ(y[0][2][2][2].item<float>(), 5.0f);   // x[1, 0]: s = 1
  EXPECT_EQ(y[0][3][3][3].item<float>(), 16.0f);  // x[3, 3]: i = j = 3, s = t = 1
  EXPECT_EQ(y.sum().item<float>(), x.sum().item<float>());  // every pixel once, zeros elsewhere
  EXPECT_EQ(y.slice(1, 4).abs().sum().item<float>(), 0.0f);
}

TEST(StemConv, RefusesAnInputThatNeedsAGradientAndAWeightOfAnotherShape) {
  const auto x = torch::randn({1, 3, 16, 16});
  EXPECT_THROW(stem_conv_space_to_depth(x.clone().requires_grad_(true), torch::randn({4, 3, 7, 7}), false),
               ptrain::Error);
  try {
    stem_conv_space_to_depth(x, torch::randn({4, 3, 5, 5}), false);
    ADD_FAILURE() << "a 5x5 weight was taken";
  } catch (const ptrain::Error& e) {
    EXPECT_NE(std::string(e.what()).find("[4, 3, 5, 5]"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(stem_space_to_depth_pays(x.to(torch::kBFloat16), torch::randn({4, 3, 7, 7})));  // on the CPU
}

TEST(StemConv, CudaRegroupingMatchesLibTorchsOpsBitForBit) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  const torch::Device cuda(torch::kCUDA, 0);
  for (const Case& k : {Case{4, 3, 224, 224, true}, Case{2, 3, 31, 20, false}, Case{3, 1, 9, 14, true},
                        Case{2, 5, 17, 18, true}}) {
    for (const auto& [in, out] : {std::pair{torch::kFloat, torch::kFloat}, std::pair{torch::kFloat, torch::kBFloat16},
                                 std::pair{torch::kBFloat16, torch::kBFloat16}, std::pair{torch::kHalf, torch::kHalf}}) {
      const std::string what = std::to_string(k.n) + "x" + std::to_string(k.c) + "x" + std::to_string(k.h) + "x" +
                               std::to_string(k.w) + " " + c10::toString(in) + " -> " + c10::toString(out);
      auto x = torch::randn({k.n, k.c, k.h, k.w}, torch::device(cuda)).to(in);
      if (k.channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
      const auto fused = stem_space_to_depth_input(x, out, /*allow_fused=*/true);
      const auto reference = stem_space_to_depth_input(x, out, /*allow_fused=*/false);
      ASSERT_EQ(fused.sizes(), reference.sizes()) << what;
      EXPECT_EQ(fused.scalar_type(), out) << what;
      EXPECT_TRUE(fused.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
      EXPECT_TRUE(torch::equal(fused, reference)) << what;
    }
  }
}

TEST(StemConv, Bf16FormMatchesTheFp32ConvolutionAndResNetTakesItOnlyInBf16) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  const torch::Device cuda(torch::kCUDA, 0);
  torch::manual_seed(7);
  const auto x = torch::randn({8, 3, 224, 224}, torch::device(cuda)).contiguous(at::MemoryFormat::ChannelsLast);
  const auto weight = (torch::randn({64, 3, 7, 7}, torch::device(cuda)) * 0.1).contiguous(at::MemoryFormat::ChannelsLast);
  const auto upstream = torch::randn({8, 64, 112, 112}, torch::device(cuda));
  const auto run = [&](bool space_to_depth, torch::ScalarType dtype) {
    auto w = weight.clone().to(dtype).requires_grad_(true);
    const auto in = x.to(dtype);
    EXPECT_EQ(stem_space_to_depth_pays(in, w), dtype == torch::kBFloat16);
    auto y = space_to_depth ? stem_conv_space_to_depth(in, w, true) : torch::conv2d(in, w, {}, 2, 3);
    (y.to(torch::kFloat) * upstream).sum().backward();
    return std::make_pair(y.detach().to(torch::kFloat), w.grad().to(torch::kFloat));
  };
  at::globalContext().setAllowTF32CuDNN(false);
  const auto [y_ref, dw_ref] = run(false, torch::kFloat);
  const auto [y, dw] = run(true, torch::kBFloat16);
  const auto [y_plain, dw_plain] = run(false, torch::kBFloat16);
  at::globalContext().setAllowTF32CuDNN(true);
  // The same error as cuDNN's own bf16 convolution: bf16 inputs and outputs, fp32 sums.
  EXPECT_LT(relative_error(y, y_ref), 8e-3);
  EXPECT_LT(relative_error(dw, dw_ref), 8e-3);
  EXPECT_LT(relative_error(y, y_ref), 2 * relative_error(y_plain, y_ref) + 1e-3);
  EXPECT_LT(relative_error(dw, dw_ref), 2 * relative_error(dw_plain, dw_ref) + 1e-3);

  ptrain::models::ResNetOptions options;
  options.depth = 50;
  auto net = std::make_shared<ptrain::models::ResNet>(options);
  net->to(cuda, torch::kBFloat16);
  net->train();
  const auto images = torch::randn({2, 3, 64, 64}, torch::device(cuda)).contiguous(at::MemoryFormat::ChannelsLast);
  const auto stem_after = [&](bool fused, const torch::Tensor& in) {
    net->set_fused_kernels(fused);
    net->forward(in);
    return net->describe_stem_conv();
  };
  EXPECT_EQ(stem_after(true, images.to(torch::kBFloat16)), "space-to-depth 4x4");
  EXPECT_EQ(stem_after(false, images.to(torch::kBFloat16)), "7x7");
  net->to(torch::kFloat);
  EXPECT_EQ(stem_after(true, images), "7x7");
  {
    ptrain::precision::AutocastGuard autocast(torch::kCUDA, true, torch::kBFloat16);
    EXPECT_EQ(stem_after(true, images), "space-to-depth 4x4");
  }
}

}  // namespace
