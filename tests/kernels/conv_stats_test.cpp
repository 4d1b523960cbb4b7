// The convolution with batch-norm statistics (and the previous batch norm + ReLU in its prologue): cuDNN's fused
// graph against LibTorch's ops on the GPU, in fp16 on ResNet-50's kinds of layer (3x3, strided 3x3, 1x1); bf16
// takes the fusion only where cuDNN has an engine and matches the reference either way. On the CPU: the
// reference against a hand computation, and bad arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <utility>
#include <vector>

#include "gpu.h"
#include "ptrain/core/cuda_runtime.h"
#include "ptrain/core/error.h"
#include "ptrain/kernels/conv_stats.h"
#include "ptrain/kernels/fused.h"

namespace {

using ptrain::kernels::conv_stats;
using ptrain::kernels::conv_stats_fused_applies;
using ptrain::kernels::conv_stats_reference;

TEST(ConvStats, ReferenceOfAOneByOneIdentityIsTheActivatedInputAndItsSums) {
  torch::manual_seed(1);
  const int64_t c = 4;
  const auto x = torch::randn({2, c, 3, 5});
  const auto scale = torch::tensor({1.5, -0.5, 2.0, 0.25}), shift = torch::tensor({0.1, 0.2, -0.3, 0.0});
  const auto out = conv_stats(x, torch::eye(c).reshape({c, c, 1, 1}), 1, 0, scale, shift);
  auto xa = x.accessor<float, 4>();
  auto ya = out.y.accessor<float, 4>();
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0, squares = 0;
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 5; ++j) {
          const double want = std::max(0.0, xa[n][ch][i][j] * scale[ch].item<double>() + shift[ch].item<double>());
          ASSERT_NEAR(ya[n][ch][i][j], want, 1e-5) << "channel " << ch;
          sum += want, squares += want * want;
        }
    EXPECT_NEAR(out.sum[ch].item<double>(), sum, 1e-4) << "channel " << ch;
    EXPECT_NEAR(out.sum_of_squares[ch].item<double>(), squares, 1e-4) << "channel " << ch;
  }
  std::string why_not;
  EXPECT_FALSE(conv_stats_fused_applies(x, torch::eye(c).reshape({c, c, 1, 1}), 1, 0, true, &why_not));
  EXPECT_NE(why_not.find("cpu"), std::string::npos) << why_not;
}

TEST(ConvStats, RefusesArgumentsThatDoNotFitNamingThem) {
  const auto x = torch::randn({1, 8, 4, 4});
  const auto expect_error = [](const std::function<void()>& fn, const std::string& words) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one saying " << words;
    } catch (const ptrain::Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  expect_error([&] { conv_stats(x, torch::randn({8, 4, 1, 1}), 1, 0); }, "weight must be [K, C, R, S] with x's C = 8");
  expect_error([&] { conv_stats(x.flatten(), torch::randn({8, 8, 1, 1}), 1, 0); }, "x must be [N, C, H, W]");
  expect_error([&] { conv_stats(x, torch::randn({8, 8, 1, 1}), 0, 0); }, "stride must be >= 1");
  expect_error([&] { conv_stats(x, torch::randn({8, 8, 1, 1}), 1, 0, torch::ones({8})); }, "scale and shift come together");
  expect_error([&] { conv_stats(x, torch::randn({8, 8, 1, 1}), 1, 0, torch::ones({4}), torch::ones({4})); },
               "one value per input channel (8), got 4 and 4");
}

struct Layer {
  const char* name;
  int64_t n, c, k, size, filter, stride;
};

// ResNet-50's kinds of layer, at a small batch: 3x3, strided 3x3, 1x1 widening and narrowing.
const Layer kLayers[] = {
    {"3x3 64", 8, 64, 64, 28, 3, 1},
    {"3x3/2 128", 8, 128, 128, 28, 3, 2},
    {"1x1 64>256", 8, 64, 256, 28, 1, 1},
    {"1x1 256>64", 8, 256, 64, 14, 1, 1},
};

// The fused graph's y and statistics against LibTorch's ops on the same inputs. The reference rounds the
// prologue's output to the dtype before its convolution, cuDNN keeps it in fp32: y agrees to the dtype's
// rounding, not bit for bit. The statistics are also checked against y as the graph returned it.
void compare(const Layer& l, torch::ScalarType dtype, bool prologue) {
  const std::string what = std::string(l.name) + " " + c10::toString(dtype) + (prologue ? " with prologue" : "");
  const torch::Device cuda(torch::kCUDA, 0);
  torch::manual_seed(7);
  const auto opts = torch::device(cuda).dtype(dtype);
  const auto x = torch::randn({l.n, l.c, l.size, l.size}, opts).contiguous(at::MemoryFormat::ChannelsLast);
  const auto w = (torch::randn({l.k, l.c, l.filter, l.filter}, opts) / std::sqrt(double(l.c * l.filter * l.filter)))
                     .contiguous(at::MemoryFormat::ChannelsLast);
  torch::Tensor scale, shift;
  if (prologue) {
    scale = torch::rand({l.c}, torch::device(cuda)) + 0.5;
    shift = torch::rand({l.c}, torch::device(cuda)) - 0.5;
  }
  const int64_t padding = l.filter / 2;
  const auto got = conv_stats(x, w, l.stride, padding, scale, shift);
  const auto want = conv_stats_reference(x, w, l.stride, padding, scale, shift);
  ASSERT_EQ(got.y.sizes(), want.y.sizes()) << what;
  EXPECT_TRUE(got.y.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
  EXPECT_EQ(got.y.scalar_type(), dtype) << what;
  const double tolerance = dtype == torch::kHalf ? 2e-3 : 1e-2;
  EXPECT_LT(relative_error(got.y, want.y), tolerance) << what;
  EXPECT_LT(relative_error(got.sum, want.sum), 2 * tolerance) << what;
  EXPECT_LT(relative_error(got.sum_of_squares, want.sum_of_squares), tolerance) << what;
  // cuDNN's fp16 engine sums its fp32 accumulators before rounding y (measured 2e-4 from the sums of the
  // rounded y on the H200), so within two of the dtype's rounding units, not exactly.
  const double rounding = dtype == torch::kHalf ? 1e-3 : 8e-3;
  const auto own = got.y.to(torch::kFloat);
  EXPECT_LT(relative_error(got.sum, own.sum({0, 2, 3})), rounding) << what;
  EXPECT_LT(relative_error(got.sum_of_squares, own.square().sum({0, 2, 3})), rounding) << what;
}

// x and weight of layer l on the GPU, uninitialised: enough to ask which path conv_stats takes.
std::pair<torch::Tensor, torch::Tensor> uninitialised_inputs(const Layer& l, torch::ScalarType dtype) {
  const auto x = torch::empty({l.n, l.c, l.size, l.size}, torch::device(torch::kCUDA).dtype(dtype))
                     .contiguous(at::MemoryFormat::ChannelsLast);
  return {x, torch::empty({l.k, l.c, l.filter, l.filter}, x.options())};
}

// cuDNN 9 has a precompiled engine for both graphs in fp16 on Ampere and Hopper (its ConvBNfprop pattern).
bool fp16_engine_expected() {
  const int major = ptrain::cuda_runtime::compute_capability(0) / 10;
  return major == 8 || major == 9;
}

TEST(ConvStats, Fp16FusedGraphMatchesLibTorchOnResNetLayers) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  if (!fp16_engine_expected()) GTEST_SKIP() << "cuDNN's fp16 ConvBNfprop engines are for Ampere and Hopper";
  for (const auto& l : kLayers)
    for (bool prologue : {false, true}) {
      const auto [x, w] = uninitialised_inputs(l, torch::kHalf);
      std::string why_not;
      ASSERT_TRUE(conv_stats_fused_applies(x, w, l.stride, l.filter / 2, prologue, &why_not))
          << l.name << (prologue ? " with prologue: " : ": ") << why_not;
      compare(l, torch::kHalf, prologue);
    }
}

// The sums must not depend on what their memory held before: blocks the allocator hands out again, filled with
// large values first, must come back as the statistics of y alone (a CUDA graph replays into the same blocks).
TEST(ConvStats, SumsDoNotDependOnWhatTheirMemoryHeld) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  if (!fp16_engine_expected()) GTEST_SKIP() << "cuDNN's fp16 ConvBNfprop engines are for Ampere and Hopper";
  const Layer& l = kLayers[2];
  const torch::Device cuda(torch::kCUDA, 0);
  torch::manual_seed(9);
  const auto opts = torch::device(cuda).dtype(torch::kHalf);
  const auto x = torch::randn({l.n, l.c, l.size, l.size}, opts).contiguous(at::MemoryFormat::ChannelsLast);
  const auto w = (torch::randn({l.k, l.c, 1, 1}, opts) * 0.1).contiguous(at::MemoryFormat::ChannelsLast);
  const auto want = conv_stats_reference(x, w, 1, 0);
  for (int round = 0; round < 3; ++round) {
    {
      std::vector<torch::Tensor> junk;
      for (int i = 0; i < 8; ++i) junk.push_back(torch::full({2 * l.k}, 1e6, torch::device(cuda).dtype(torch::kFloat)));
    }
    const auto got = conv_stats(x, w, 1, 0);
    EXPECT_LT(relative_error(got.sum, want.sum), 4e-3) << "round " << round;
    EXPECT_LT(relative_error(got.sum_of_squares, want.sum_of_squares), 2e-3) << "round " << round;
  }
}

TEST(ConvStats, Bf16TakesTheFusionWhereCuDnnHasAnEngineAndMatchesEitherWay) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  for (const auto& l : kLayers)
    for (bool prologue : {false, true}) {
      const auto [x, w] = uninitialised_inputs(l, torch::kBFloat16);
      std::string why_not;
      const bool fused = conv_stats_fused_applies(x, w, l.stride, l.filter / 2, prologue, &why_not);
      std::cout << "[          ] bf16 " << l.name << (prologue ? " with prologue" : "") << ": "
                << (fused ? "cuDNN fused graph" : "LibTorch's ops (" + why_not + ")") << "\n";
      if (!fused) {
        EXPECT_THROW(ptrain::kernels::fused::conv_stats(x, w, l.stride, l.filter / 2,
                                                        prologue ? torch::ones({l.c}, x.options()) : torch::Tensor(),
                                                        prologue ? torch::ones({l.c}, x.options()) : torch::Tensor()),
                     ptrain::Error);
      }
      compare(l, torch::kBFloat16, prologue);
    }
}

}  // namespace
