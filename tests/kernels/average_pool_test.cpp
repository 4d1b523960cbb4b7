// global_average_pool against LibTorch's adaptive_avg_pool2d to 1x1: the values and the gradient, and the
// gradient laid out as the input (channels-last stays channels-last: what the layer before expects), on the
// CPU and, where there is one, on a CUDA device.
#include <gtest/gtest.h>

#include <string>

#include "ptrain/kernels/average_pool.h"

namespace {

void compare(const torch::Device& device, torch::ScalarType dtype, at::MemoryFormat format) {
  const std::string what = device.str() + " " + c10::toString(dtype) +
                           (format == at::MemoryFormat::ChannelsLast ? " channels-last" : " contiguous");
  torch::manual_seed(3);
  const auto base = torch::randn({4, 24, 7, 5}, torch::device(device)).to(dtype).contiguous(format);
  const auto grad = torch::randn({4, 24}, torch::device(device)).to(dtype);
  auto x = base.detach().clone().requires_grad_(true);
  auto reference_x = base.detach().clone().requires_grad_(true);
  const auto y = ptrain::kernels::global_average_pool(x);
  const auto reference = torch::adaptive_avg_pool2d(reference_x, {1, 1}).flatten(1);
  y.backward(grad);
  reference.backward(grad);
  const double tolerance = dtype == torch::kFloat ? 1e-6 : 1e-2;
  ASSERT_EQ(y.sizes(), reference.sizes()) << what;
  EXPECT_LE((y.to(torch::kFloat) - reference.to(torch::kFloat)).abs().max().item<float>(), tolerance) << what;
  EXPECT_LE((x.grad().to(torch::kFloat) - reference_x.grad().to(torch::kFloat)).abs().max().item<float>(), tolerance)
      << what;
  // Not vacuous: the gradient is grad / (H * W) at every pixel.
  EXPECT_NEAR(x.grad()[1][5][3][2].item<float>(), grad[1][5].item<float>() / 35.0f, tolerance) << what;
  EXPECT_TRUE(x.grad().is_contiguous(format)) << what << ": the gradient keeps the input's layout";
  EXPECT_EQ(x.grad().scalar_type(), dtype) << what;
}

TEST(GlobalAveragePool, MatchesAdaptiveAvgPoolAndKeepsTheLayout) {
  std::vector<torch::Device> devices{torch::kCPU};
  if (torch::cuda::is_available()) devices.emplace_back(torch::kCUDA, 0);
  for (const auto& device : devices)
    for (const auto dtype : {torch::kFloat, torch::kBFloat16})
      for (const auto format : {at::MemoryFormat::Contiguous, at::MemoryFormat::ChannelsLast})
        compare(device, dtype, format);
}

TEST(GlobalAveragePool, RefusesWhatIsNotFourDimensional) {
  try {
    ptrain::kernels::global_average_pool(torch::zeros({2, 3, 4}));
    FAIL() << "a 3-D input was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("4-D"), std::string::npos) << e.what();
  }
}

}  // namespace
