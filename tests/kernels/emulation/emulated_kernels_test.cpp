// ptrain's CUDA kernels run on the CPU through cuda_emulation.h (one host thread per CUDA thread), against LibTorch
// on the CPU: the column sums of cuda/column_sums.cuh behind a linear layer's bias gradient (alone, and after GELU's
// backward in cuda/linear.cu), and the residual add + LayerNorm of cuda/layer_norm.cu, forward and backward. This is
// where kernels written without a GPU get their indexing, coverage and reduction order checked before a device call;
// the GPU parity tests (tests/kernels/linear_test.cpp, layer_norm_test.cpp) stay the word on the device itself.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ptrain/kernels/cuda/launch.h"

namespace cuda = ptrain::kernels::cuda;

namespace {

cuda::Dtype dtype_of(torch::ScalarType t) {
  return t == torch::kFloat ? cuda::Dtype::kFloat : t == torch::kHalf ? cuda::Dtype::kHalf : cuda::Dtype::kBFloat16;
}

double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  const auto g = got.to(torch::kDouble), w = want.to(torch::kDouble);
  return (g - w).norm().item<double>() / std::max(1e-30, w.norm().item<double>());
}

torch::Tensor workspace(int64_t floats) { return torch::full({floats}, std::nanf(""), torch::kFloat); }

// Shapes that take one part of a tile, more than one tile, a short last chunk, many chunks.
const std::vector<std::pair<int64_t, int64_t>> kShapes = {{1, 8}, {21, 24}, {130, 264}, {1030, 16}};

TEST(EmulatedKernels, BiasGradientIsTheColumnSums) {
  torch::manual_seed(31);
  for (const auto dtype : {torch::kBFloat16, torch::kHalf, torch::kFloat}) {
    for (const auto& [rows, cols] : kShapes) {
      const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + " " + c10::toString(dtype);
      const auto grad = torch::randn({rows, cols}).to(dtype);
      auto out = torch::full({cols}, std::nanf(""), torch::kFloat);
      auto ws = workspace(cuda::bias_gradient_workspace_floats(rows, cols));
      cuda::bias_gradient({dtype_of(dtype), cuda::Dtype::kFloat, rows, cols}, grad.data_ptr(), out.data_ptr(),
                          ws.data_ptr<float>(), nullptr);
      EXPECT_LT(relative_error(out, grad.to(torch::kDouble).sum(0)), 1e-6) << what;
      // In the bias's own dtype, as GPT's bf16 casts take it.
      auto out_bf16 = torch::zeros({cols}, torch::kBFloat16);
      cuda::bias_gradient({dtype_of(dtype), cuda::Dtype::kBFloat16, rows, cols}, grad.data_ptr(), out_bf16.data_ptr(),
                          ws.data_ptr<float>(), nullptr);
      EXPECT_TRUE(torch::equal(out_bf16, out.to(torch::kBFloat16))) << what << ": the bf16 result is the fp32 sum rounded";
    }
  }
}

TEST(EmulatedKernels, GeluBackwardThenBiasGradientMatchesLibTorch) {
  torch::manual_seed(32);
  for (const auto dtype : {torch::kBFloat16, torch::kFloat}) {
    for (const auto& [rows, cols] : kShapes) {
      const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + " " + c10::toString(dtype);
      const auto grad = torch::randn({rows, cols}).to(dtype);
      const auto h = (torch::randn({rows, cols}) * 3).to(dtype);
      auto grad_input = torch::full({rows, cols}, std::nanf("")).to(dtype);
      auto bias = torch::full({cols}, std::nanf(""), torch::kFloat);
      auto ws = workspace(cuda::bias_gradient_workspace_floats(rows, cols));
      cuda::gelu_backward_bias_gradient({dtype_of(dtype), cuda::Dtype::kFloat, rows, cols},
                                        {grad.data_ptr(), h.data_ptr(), grad_input.data_ptr()}, bias.data_ptr(),
                                        ws.data_ptr<float>(), nullptr);
      const auto want = at::gelu_backward(grad.to(torch::kFloat), h.to(torch::kFloat), "tanh").to(dtype);
      EXPECT_LT(relative_error(grad_input, want), dtype == torch::kFloat ? 1e-6 : 4e-3) << what << ": grad_input";
      EXPECT_LT(relative_error(bias, grad_input.to(torch::kDouble).sum(0)), 1e-6) << what << ": the sums of what it wrote";
    }
  }
}

// The fused residual add + LayerNorm, forward and backward, with the sum's gradient from a later use.
TEST(EmulatedKernels, AddLayerNormMatchesLibTorch) {
  torch::manual_seed(33);
  for (const auto& [rows, cols, out_dtype] : {std::tuple{37, 1600, torch::kBFloat16}, std::tuple{70, 264, torch::kFloat}}) {
    const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + " " + c10::toString(out_dtype);
    const auto x = torch::randn({rows, cols}) * 3 + 1;
    const auto branch = torch::randn({rows, cols}).to(torch::kBFloat16);
    const auto weight = torch::rand({cols}) + 0.5, bias = torch::randn({cols}) * 0.1;
    const auto dout = torch::randn({rows, cols}).to(out_dtype);
    const auto dsum = torch::randn({rows, cols});

    auto sum = torch::empty({rows, cols}), out = torch::empty({rows, cols}, out_dtype);
    auto mean = torch::empty({rows}), rstd = torch::empty({rows});
    const cuda::LayerNormShape shape{cuda::Dtype::kBFloat16, dtype_of(out_dtype), rows, cols};
    cuda::add_layer_norm_forward(shape, {x.data_ptr<float>(), branch.data_ptr(), sum.data_ptr<float>(), out.data_ptr(),
                                         mean.data_ptr<float>(), rstd.data_ptr<float>()},
                                 weight.data_ptr<float>(), bias.data_ptr<float>(), 1e-5, nullptr);
    auto grad_input = torch::empty({rows, cols}), grad_branch = torch::empty({rows, cols}, torch::kBFloat16);
    auto grad_weight = torch::empty({cols}), grad_bias = torch::empty({cols});
    auto ws = workspace(cuda::layer_norm_workspace_floats(rows, cols));
    cuda::add_layer_norm_backward(shape, {dout.data_ptr(), dsum.data_ptr<float>(), sum.data_ptr<float>(),
                                          mean.data_ptr<float>(), rstd.data_ptr<float>(), grad_input.data_ptr<float>(),
                                          grad_branch.data_ptr()},
                                  weight.data_ptr<float>(), grad_weight.data_ptr<float>(), grad_bias.data_ptr<float>(),
                                  ws.data_ptr<float>(), nullptr);

    auto rx = x.clone().requires_grad_(true), rb = branch.to(torch::kFloat).requires_grad_(true);
    auto rw = weight.clone().requires_grad_(true), rc = bias.clone().requires_grad_(true);
    auto rsum = rx + rb;
    auto rout = torch::layer_norm(rsum, {cols}, rw, rc, 1e-5);
    ((rout * dout.to(torch::kFloat)).sum() + (rsum * dsum).sum()).backward();

    EXPECT_LT(relative_error(sum, rsum), 1e-6) << what << ": sum";
    EXPECT_LT(relative_error(out, rout), out_dtype == torch::kFloat ? 1e-5 : 1e-2) << what << ": out";
    EXPECT_LT(relative_error(grad_input, rx.grad()), 1e-4) << what << ": dx";
    EXPECT_LT(relative_error(grad_branch, rb.grad()), 1e-2) << what << ": dbranch";
    EXPECT_LT(relative_error(grad_weight, rw.grad()), 1e-4) << what << ": dweight";
    EXPECT_LT(relative_error(grad_bias, rc.grad()), 1e-4) << what << ": dbias";
  }
}

}  // namespace
