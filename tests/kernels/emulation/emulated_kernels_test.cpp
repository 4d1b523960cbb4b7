// ptrain's CUDA kernels run on the CPU through cuda_emulation.h (one host thread per CUDA thread), against LibTorch
// on the CPU: the column sums of cuda/column_sums.cuh behind a linear layer's bias gradient (alone, and after GELU's
// backward in cuda/linear.cu), GELU's forward with its output's amax (cuda/linear.cu, amax.cuh), the residual add +
// LayerNorm of cuda/layer_norm.cu (with its output's amax), the batch norm + ReLU of
// cuda/batch_norm.cu (split and single pass), the cross-entropy of cuda/cross_entropy.cu and the max pooling of
// cuda/max_pool.cu, each forward and backward. This is
// where kernels written without a GPU get their indexing, coverage and reduction order checked before a device call;
// the GPU parity tests (tests/kernels/linear_test.cpp, layer_norm_test.cpp) stay the word on the device itself.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>

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

// The bits atomicMax raises, as the float they hold.
float amax_value(unsigned int bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// GELU's forward (tanh) in LibTorch's fp32 steps, and the amax of what it wrote exactly: over lengths below, at and
// past a vector, across several blocks, and from an address off the vectors' alignment (the scalar path).
TEST(EmulatedKernels, GeluForwardTakesTheAmaxOfWhatItWrites) {
  torch::manual_seed(34);
  for (const auto dtype : {torch::kBFloat16, torch::kFloat}) {
    for (const int64_t n : {int64_t{1}, int64_t{8}, int64_t{13}, int64_t{256 * 8 * 3 + 5}}) {
      for (const int64_t offset : {0, 1}) {
        const std::string what = std::to_string(n) + " " + c10::toString(dtype) + (offset ? " unaligned" : "");
        const auto x = (torch::randn({n + offset}) * 3).to(dtype).narrow(0, offset, n);
        auto y = torch::full({n + offset}, std::nanf("")).to(dtype).narrow(0, offset, n);
        unsigned int bits = 0;
        cuda::gelu_tanh_forward(dtype_of(dtype), x.data_ptr(), y.data_ptr(), n, &bits, nullptr);
        const auto want = torch::gelu(x.to(torch::kFloat), "tanh").to(dtype);
        EXPECT_LT(relative_error(y, want), dtype == torch::kFloat ? 1e-6 : 4e-3) << what;
        EXPECT_EQ(amax_value(bits), y.abs().max().item<float>()) << what;
      }
    }
  }
  // The backward: LibTorch's gelu_backward, and the amax of the gradient as written.
  for (const auto dtype : {torch::kBFloat16, torch::kFloat}) {
    for (const int64_t n : {int64_t{5}, int64_t{256 * 8 * 3 + 5}}) {
      const std::string what = "backward " + std::to_string(n) + " " + c10::toString(dtype);
      const auto grad = torch::randn({n}).to(dtype), h = (torch::randn({n}) * 3).to(dtype);
      auto grad_h = torch::full({n}, std::nanf("")).to(dtype);
      unsigned int bits = 0;
      cuda::gelu_tanh_backward(dtype_of(dtype), grad.data_ptr(), h.data_ptr(), grad_h.data_ptr(), n, &bits, nullptr);
      const auto want = at::gelu_backward(grad.to(torch::kFloat), h.to(torch::kFloat), "tanh").to(dtype);
      EXPECT_LT(relative_error(grad_h, want), dtype == torch::kFloat ? 1e-6 : 4e-3) << what;
      EXPECT_EQ(amax_value(bits), grad_h.abs().max().item<float>()) << what;
    }
  }
  // A NaN anywhere makes the amax NaN, as LibTorch's max does: the scale must not hide it.
  auto x = torch::randn({100}).to(torch::kBFloat16);
  x[57] = std::nanf("");
  auto y = torch::empty_like(x);
  unsigned int bits = 0;
  cuda::gelu_tanh_forward(cuda::Dtype::kBFloat16, x.data_ptr(), y.data_ptr(), 100, &bits, nullptr);
  EXPECT_TRUE(std::isnan(amax_value(bits)));
}

// The fused residual add + LayerNorm, forward and backward, with the sum's gradient from a later use; and the plain
// LayerNorm (no branch) that starts the chain. Widths of one, two (part used) and seven (part used) groups of 256.
// The forward also takes out's amax, which must be that of out as written exactly.
void expect_layer_norm_matches(int64_t rows, int64_t cols, torch::ScalarType out_dtype, bool with_branch) {
  const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + " " + c10::toString(out_dtype) +
                           (with_branch ? " + branch" : "");
  const auto x = torch::randn({rows, cols}) * 3 + 1;
  const auto branch = torch::randn({rows, cols}).to(torch::kBFloat16);
  const auto weight = torch::rand({cols}) + 0.5, bias = torch::randn({cols}) * 0.1;
  const auto dout = torch::randn({rows, cols}).to(out_dtype);
  const auto dsum = torch::randn({rows, cols});

  auto sum = torch::full({rows, cols}, std::nanf("")), out = torch::empty({rows, cols}, out_dtype);
  auto mean = torch::empty({rows}), rstd = torch::empty({rows});
  const cuda::LayerNormShape shape{with_branch ? cuda::Dtype::kBFloat16 : cuda::Dtype::kFloat, dtype_of(out_dtype), rows,
                                   cols};
  unsigned int amax_bits = 0;
  cuda::add_layer_norm_forward(shape, {x.data_ptr<float>(), with_branch ? branch.data_ptr() : nullptr,
                                       with_branch ? sum.data_ptr<float>() : nullptr, out.data_ptr(),
                                       mean.data_ptr<float>(), rstd.data_ptr<float>(), &amax_bits},
                               weight.data_ptr<float>(), bias.data_ptr<float>(), 1e-5, nullptr);
  EXPECT_EQ(amax_value(amax_bits), out.abs().max().item<float>()) << what << ": out's amax";
  const auto& input = with_branch ? sum : x;
  auto grad_input = torch::empty({rows, cols}), grad_branch = torch::empty({rows, cols}, torch::kBFloat16);
  auto grad_weight = torch::empty({cols}), grad_bias = torch::empty({cols});
  auto ws = workspace(cuda::layer_norm_workspace_floats(rows, cols));
  cuda::add_layer_norm_backward(shape, {dout.data_ptr(), with_branch ? dsum.data_ptr<float>() : nullptr,
                                        input.data_ptr<float>(), mean.data_ptr<float>(), rstd.data_ptr<float>(),
                                        grad_input.data_ptr<float>(), with_branch ? grad_branch.data_ptr() : nullptr},
                                weight.data_ptr<float>(), grad_weight.data_ptr<float>(), grad_bias.data_ptr<float>(),
                                ws.data_ptr<float>(), nullptr);

  auto rx = x.clone().requires_grad_(true), rb = branch.to(torch::kFloat).requires_grad_(true);
  auto rw = weight.clone().requires_grad_(true), rc = bias.clone().requires_grad_(true);
  auto rsum = with_branch ? rx + rb : rx;
  auto rout = torch::layer_norm(rsum, {cols}, rw, rc, 1e-5);
  auto loss = (rout * dout.to(torch::kFloat)).sum();
  if (with_branch) loss = loss + (rsum * dsum).sum();
  loss.backward();

  if (with_branch) { EXPECT_LT(relative_error(sum, rsum), 1e-6) << what << ": sum"; }
  EXPECT_LT(relative_error(out, rout), out_dtype == torch::kFloat ? 1e-5 : 1e-2) << what << ": out";
  EXPECT_LT(relative_error(grad_input, rx.grad()), 1e-4) << what << ": dx";
  if (with_branch) { EXPECT_LT(relative_error(grad_branch, rb.grad()), 1e-2) << what << ": dbranch"; }
  EXPECT_LT(relative_error(grad_weight, rw.grad()), 1e-4) << what << ": dweight";
  EXPECT_LT(relative_error(grad_bias, rc.grad()), 1e-4) << what << ": dbias";
}

TEST(EmulatedKernels, AddLayerNormMatchesLibTorch) {
  torch::manual_seed(33);
  for (const bool with_branch : {true, false}) {
    expect_layer_norm_matches(37, 1600, torch::kBFloat16, with_branch);
    expect_layer_norm_matches(70, 264, torch::kFloat, with_branch);
    expect_layer_norm_matches(9, 8, torch::kBFloat16, with_branch);
  }
}

// Training-mode batch norm + ReLU (+ residual) over NHWC rows, forward and backward, in both of batch_norm.cu's
// forms: three launches (split) and one cooperative launch (single pass, every block at once here). far: a mean of
// 1000 with a spread of 0.1, where statistics taken carelessly lose the variance.
void expect_batch_norm_matches(torch::ScalarType dtype, int64_t rows, int64_t channels, bool residual, bool far,
                               cuda::BatchNormPasses passes) {
  const std::string what = std::to_string(rows) + "x" + std::to_string(channels) + " " + c10::toString(dtype) +
                           (residual ? " residual" : "") + (far ? " far from zero" : "") +
                           (passes == cuda::BatchNormPasses::kSplit ? " split" : " single pass");
  const auto x = (far ? torch::randn({rows, channels}) * 0.1 + 1000 : torch::randn({rows, channels}) * 2 + 0.5).to(dtype);
  const auto r = torch::randn({rows, channels}).to(dtype);
  const auto weight = torch::rand({channels}) + 0.5, bias = torch::randn({channels}) * 0.1;
  const auto dy = torch::randn({rows, channels}).to(dtype);
  auto running_mean = torch::zeros({channels}), running_var = torch::ones({channels});
  auto mean = torch::empty({channels}), invstd = torch::empty({channels}), scale_shift = torch::empty({2 * channels});
  auto y = torch::empty({rows, channels}, dtype);
  auto ws = workspace(cuda::batch_norm_workspace_floats(rows, channels));
  const cuda::BatchNormShape shape{dtype_of(dtype), cuda::Dtype::kFloat, rows, channels};
  const cuda::BatchNormSide side{weight.data_ptr(), bias.data_ptr(), running_mean.data_ptr(), running_var.data_ptr(),
                                 0.1, 1e-5, mean.data_ptr<float>(), invstd.data_ptr<float>(),
                                 scale_shift.data_ptr<float>()};
  cuda::BatchNormForwardRun run;
  run.passes = passes;
  const bool single = cuda::batch_norm_relu_forward(
      shape, {x.data_ptr(), residual ? r.data_ptr() : nullptr, true, y.data_ptr()}, side, ws.data_ptr<float>(), nullptr, run);
  EXPECT_EQ(single, passes == cuda::BatchNormPasses::kSinglePass) << what << ": which form ran";

  auto dx = torch::empty({rows, channels}, dtype), dr = torch::empty({rows, channels}, dtype);
  auto dweight = torch::empty({channels}), dbias = torch::empty({channels});
  auto ws2 = workspace(cuda::batch_norm_workspace_floats(rows, channels));
  const cuda::BatchNormReluBackwardIo io{dy.data_ptr(), nullptr, residual ? y.data_ptr() : nullptr, x.data_ptr(), true,
                                         dx.data_ptr(), residual ? dr.data_ptr() : nullptr};
  cuda::batch_norm_relu_backward(shape, io, side, {dweight.data_ptr(), dbias.data_ptr()}, ws2.data_ptr<float>(),
                                 nullptr, passes);

  // LibTorch in fp64 on the same inputs.
  auto rx = x.to(torch::kDouble).requires_grad_(true), rr = r.to(torch::kDouble).requires_grad_(true);
  auto rw = weight.to(torch::kDouble).requires_grad_(true), rb = bias.to(torch::kDouble).requires_grad_(true);
  auto want_running_mean = torch::zeros({channels}, torch::kDouble), want_running_var = torch::ones({channels}, torch::kDouble);
  auto z = torch::batch_norm(rx, rw, rb, want_running_mean, want_running_var, true, 0.1, 1e-5, false);
  if (residual) z = z + rr;
  auto ry = torch::relu(z);
  ry.backward(dy.to(torch::kDouble));
  const auto xd = x.to(torch::kDouble);
  const double spread = xd.std(0).mean().item<double>();
  // fp32 statistics of the same values: within fp32's rounding, except far from zero, where the mean's rounding
  // (6e-5 at 1000) is a part in 1,600 of the spread and the variance's a part in a thousand.
  EXPECT_LT((mean.to(torch::kDouble) - xd.mean(0)).abs().max().item<double>(), (far ? 1e-2 : 1e-5) * spread)
      << what << ": mean";
  EXPECT_LT(relative_error(invstd, 1.0 / (xd.var(0, false) + 1e-5).sqrt()), far ? 1e-3 : 1e-5) << what << ": invstd";
  EXPECT_LT(relative_error(running_mean, want_running_mean), 1e-4) << what << ": running mean";
  EXPECT_LT(relative_error(running_var, want_running_var), 1e-3) << what << ": running var";
  const double tol = dtype == torch::kFloat ? (far ? 1e-3 : 1e-5) : 1e-2;
  EXPECT_LT(relative_error(y, ry), tol) << what << ": y";
  // Far from zero, fp32's step at 1000 (6e-5) is 6e-4 of the spread: the ReLU's mask differs from fp64's wherever the
  // normalised value is that close to zero, and with it the gradients, as they would on a GPU. The statistics above
  // are what that case checks.
  if (far) return;
  EXPECT_LT(relative_error(dx, rx.grad()), tol * 2) << what << ": dx";
  if (residual) { EXPECT_LT(relative_error(dr, rr.grad()), tol) << what << ": dresidual"; }
  EXPECT_LT(relative_error(dweight, rw.grad()), tol) << what << ": dweight";
  EXPECT_LT(relative_error(dbias, rb.grad()), tol) << what << ": dbias";
}

TEST(EmulatedKernels, BatchNormReluMatchesLibTorch) {
  torch::manual_seed(34);
  for (const auto passes : {cuda::BatchNormPasses::kSplit, cuda::BatchNormPasses::kSinglePass}) {
    // 2,600 rows: three chunks split (1,024 rows each), two in the single pass (one a multiprocessor), so that the
    // chunks' statistics are merged.
    expect_batch_norm_matches(torch::kBFloat16, 2600, 64, false, false, passes);
    expect_batch_norm_matches(torch::kBFloat16, 2600, 64, true, false, passes);
    expect_batch_norm_matches(torch::kFloat, 77, 16, true, false, passes);
    expect_batch_norm_matches(torch::kFloat, 2100, 32, false, true, passes);
  }
}

// A downsampling block's end, relu(bn(x) + bn2(x2)), in its one cooperative launch each way, against LibTorch in fp64.
TEST(EmulatedKernels, DualBatchNormReluMatchesLibTorch) {
  torch::manual_seed(37);
  const int64_t rows = 1200, channels = 64;
  const auto dtype = torch::kBFloat16;
  const auto x = (torch::randn({rows, channels}) * 2 + 0.5).to(dtype), x2 = (torch::randn({rows, channels}) - 1).to(dtype);
  const auto dy = torch::randn({rows, channels}).to(dtype);
  struct Side {
    torch::Tensor weight, bias, running_mean, running_var, mean, invstd, scale_shift, dweight, dbias;
    cuda::BatchNormSide side() {
      return {weight.data_ptr(), bias.data_ptr(), running_mean.data_ptr(), running_var.data_ptr(), 0.1, 1e-5,
              mean.data_ptr<float>(), invstd.data_ptr<float>(), scale_shift.data_ptr<float>()};
    }
  };
  const auto make_side = [&] {
    return Side{torch::rand({channels}) + 0.5, torch::randn({channels}) * 0.1, torch::zeros({channels}),
                torch::ones({channels}), torch::empty({channels}), torch::empty({channels}),
                torch::empty({2 * channels}), torch::empty({channels}), torch::empty({channels})};
  };
  Side a = make_side(), b = make_side();
  const cuda::BatchNormShape shape{cuda::Dtype::kBFloat16, cuda::Dtype::kFloat, rows, channels};
  auto y = torch::empty({rows, channels}, dtype);
  auto ws = workspace(cuda::dual_batch_norm_workspace_floats(rows, channels));
  ASSERT_TRUE(cuda::batch_norm_add_batch_norm_relu_forward(shape, x.data_ptr(), x2.data_ptr(), a.side(), b.side(),
                                                           y.data_ptr(), ws.data_ptr<float>(), nullptr));
  auto dx = torch::empty({rows, channels}, dtype), dx2 = torch::empty({rows, channels}, dtype);
  auto ws2 = workspace(cuda::dual_batch_norm_workspace_floats(rows, channels));
  ASSERT_TRUE(cuda::batch_norm_add_batch_norm_relu_backward(
      shape, {dy.data_ptr(), nullptr, y.data_ptr(), x.data_ptr(), x2.data_ptr(), dx.data_ptr(), dx2.data_ptr()}, a.side(),
      b.side(), {a.dweight.data_ptr(), a.dbias.data_ptr()}, {b.dweight.data_ptr(), b.dbias.data_ptr()},
      ws2.data_ptr<float>(), nullptr));

  auto rx = x.to(torch::kDouble).requires_grad_(true), rx2 = x2.to(torch::kDouble).requires_grad_(true);
  auto rw = a.weight.to(torch::kDouble).requires_grad_(true), rb = a.bias.to(torch::kDouble).requires_grad_(true);
  auto rw2 = b.weight.to(torch::kDouble).requires_grad_(true), rb2 = b.bias.to(torch::kDouble).requires_grad_(true);
  auto rm = torch::zeros({channels}, torch::kDouble), rv = torch::ones({channels}, torch::kDouble);
  auto rm2 = torch::zeros({channels}, torch::kDouble), rv2 = torch::ones({channels}, torch::kDouble);
  auto ry = torch::relu(torch::batch_norm(rx, rw, rb, rm, rv, true, 0.1, 1e-5, false) +
                        torch::batch_norm(rx2, rw2, rb2, rm2, rv2, true, 0.1, 1e-5, false));
  ry.backward(dy.to(torch::kDouble));
  EXPECT_LT(relative_error(y, ry), 1e-2) << "y";
  EXPECT_LT(relative_error(a.running_mean, rm), 1e-4) << "running mean";
  EXPECT_LT(relative_error(b.running_var, rv2), 1e-4) << "the shortcut's running var";
  EXPECT_LT(relative_error(dx, rx.grad()), 2e-2) << "dx";
  EXPECT_LT(relative_error(dx2, rx2.grad()), 2e-2) << "dx2";
  EXPECT_LT(relative_error(a.dweight, rw.grad()), 1e-2) << "dweight";
  EXPECT_LT(relative_error(b.dbias, rb2.grad()), 1e-2) << "the shortcut's dbias";
}

// ResNet's stem, max_pool(relu(bn(x))) with a 3x3 stride-2 pooling, in its one cooperative launch each way.
TEST(EmulatedKernels, BatchNormReluMaxPoolMatchesLibTorch) {
  torch::manual_seed(38);
  const cuda::PoolShape pool{2, 64, 18, 18, 9, 9, 3, 2, 1};
  const int64_t channels = pool.channels, rows = pool.batch * pool.in_h * pool.in_w;
  const auto x = torch::randn({pool.batch, pool.in_h, pool.in_w, channels});
  const auto weight = torch::rand({channels}) + 0.5, bias = torch::randn({channels}) * 0.1;
  auto running_mean = torch::zeros({channels}), running_var = torch::ones({channels});
  auto mean = torch::empty({channels}), invstd = torch::empty({channels}), scale_shift = torch::empty({2 * channels});
  const cuda::BatchNormSide side{weight.data_ptr(), bias.data_ptr(), running_mean.data_ptr(), running_var.data_ptr(),
                                 0.1, 1e-5, mean.data_ptr<float>(), invstd.data_ptr<float>(), scale_shift.data_ptr<float>()};
  auto y = torch::empty({pool.batch, pool.out_h, pool.out_w, channels});
  auto positions = torch::empty({pool.batch, pool.out_h, pool.out_w, channels}, torch::kUInt8);
  auto ws = workspace(cuda::batch_norm_workspace_floats(rows, channels));
  ASSERT_TRUE(cuda::batch_norm_relu_max_pool_forward(cuda::Dtype::kFloat, cuda::Dtype::kFloat, pool,
                                                     {x.data_ptr(), y.data_ptr(), positions.data_ptr<uint8_t>()}, side,
                                                     ws.data_ptr<float>(), nullptr));
  const auto dy = torch::randn(y.sizes());
  auto dx = torch::empty(x.sizes()), dweight = torch::empty({channels}), dbias = torch::empty({channels});
  auto ws2 = workspace(cuda::batch_norm_workspace_floats(rows, channels));
  ASSERT_TRUE(cuda::batch_norm_relu_max_pool_backward(
      cuda::Dtype::kFloat, cuda::Dtype::kFloat, pool, {dy.data_ptr(), positions.data_ptr<uint8_t>(), x.data_ptr(), dx.data_ptr()},
      side, {dweight.data_ptr(), dbias.data_ptr()}, ws2.data_ptr<float>(), nullptr));

  auto rx = x.to(torch::kDouble).permute({0, 3, 1, 2}).requires_grad_(true);
  auto rw = weight.to(torch::kDouble).requires_grad_(true), rb = bias.to(torch::kDouble).requires_grad_(true);
  auto rm = torch::zeros({channels}, torch::kDouble), rv = torch::ones({channels}, torch::kDouble);
  auto ry = torch::max_pool2d(torch::relu(torch::batch_norm(rx, rw, rb, rm, rv, true, 0.1, 1e-5, false)), {3, 3},
                              {2, 2}, {1, 1});
  ry.backward(dy.to(torch::kDouble).permute({0, 3, 1, 2}));
  EXPECT_LT(relative_error(y, ry.permute({0, 2, 3, 1})), 1e-5) << "y";
  EXPECT_LT(relative_error(running_var, rv), 1e-5) << "running var";
  EXPECT_LT(relative_error(dx, rx.grad().permute({0, 2, 3, 1})), 1e-4) << "dx";
  EXPECT_LT(relative_error(dweight, rw.grad()), 1e-4) << "dweight";
  EXPECT_LT(relative_error(dbias, rb.grad()), 1e-4) << "dbias";
}

// Rows of logits wider than their classes (a padded vocabulary), a row stride that leaves rows unaligned, and one
// label out of range (NaN, not a silent number).
TEST(EmulatedKernels, CrossEntropyMatchesLibTorch) {
  torch::manual_seed(35);
  for (const auto dtype : {torch::kBFloat16, torch::kFloat}) {
    const int64_t rows = 6, classes = 500, width = 512, stride = 530;
    const std::string what = c10::toString(dtype);
    const auto storage = (torch::randn({rows, stride}) * 3).to(dtype);
    const auto logits = storage.narrow(1, 0, width);
    auto labels = torch::randint(classes, {rows}, torch::kInt64);
    labels[2] = classes + 3;
    auto loss = torch::empty({rows}), lse = torch::empty({rows}), correct = torch::empty({rows});
    const cuda::CrossEntropyLogits in{dtype_of(dtype), storage.data_ptr(), rows, classes, stride, labels.data_ptr<int64_t>()};
    cuda::cross_entropy_forward(in, loss.data_ptr<float>(), lse.data_ptr<float>(), correct.data_ptr<float>(), nullptr);
    const auto x = logits.narrow(1, 0, classes).to(torch::kDouble);
    const auto want_lse = x.logsumexp(1);
    const auto valid = labels < classes;
    const auto safe = labels.clamp_max(classes - 1);
    const auto want_loss = want_lse - x.gather(1, safe.unsqueeze(1)).squeeze(1);
    EXPECT_TRUE(std::isnan(loss[2].item<float>())) << what << ": a label out of range";
    EXPECT_LT(relative_error(loss.masked_select(valid), want_loss.masked_select(valid)), 1e-5) << what << ": loss";
    EXPECT_LT(relative_error(lse, want_lse), 1e-6) << what << ": lse";
    const auto want_correct = (x.argmax(1) == labels).to(torch::kFloat);
    EXPECT_TRUE(torch::equal(correct, want_correct)) << what << ": correct";

    auto grad = torch::full({rows, width}, std::nanf("")).to(dtype);
    const auto scale = torch::full({}, 0.25f);
    cuda::cross_entropy_backward(in, width, lse.data_ptr<float>(), scale.data_ptr<float>(), grad.data_ptr(), width, nullptr);
    auto want = (x - want_lse.unsqueeze(1)).exp();
    want.scatter_add_(1, safe.unsqueeze(1), -valid.to(torch::kDouble).unsqueeze(1));
    want = want * 0.25;
    EXPECT_LT(relative_error(grad.narrow(1, 0, classes), want), dtype == torch::kFloat ? 1e-5 : 1e-2) << what << ": grad";
    EXPECT_TRUE(torch::equal(grad.narrow(1, classes, width - classes), torch::zeros({rows, width - classes}, dtype)))
        << what << ": the padding's gradient";
  }
}

// ResNet's stem pooling (3x3, stride 2, padding 1) over NHWC, against LibTorch's max_pool2d: the maxima, and in fp32
// (no ties) the gradient through the positions kept.
TEST(EmulatedKernels, MaxPoolMatchesLibTorch) {
  torch::manual_seed(36);
  for (const auto dtype : {torch::kBFloat16, torch::kFloat}) {
    const std::string what = c10::toString(dtype);
    const cuda::PoolShape shape{2, 16, 9, 11, 5, 6, 3, 2, 1};
    const auto x = torch::randn({shape.batch, shape.in_h, shape.in_w, shape.channels}).to(dtype);
    auto y = torch::empty({shape.batch, shape.out_h, shape.out_w, shape.channels}, dtype);
    auto positions = torch::empty({shape.batch, shape.out_h, shape.out_w, shape.channels}, torch::kUInt8);
    cuda::max_pool_forward(dtype_of(dtype), x.data_ptr(), shape, y.data_ptr(), positions.data_ptr<uint8_t>(), nullptr);
    auto rx = x.to(torch::kFloat).permute({0, 3, 1, 2}).contiguous().requires_grad_(true);
    auto ry = torch::max_pool2d(rx, {3, 3}, {2, 2}, {1, 1});
    EXPECT_TRUE(torch::equal(y.to(torch::kFloat), ry.permute({0, 2, 3, 1}).detach())) << what << ": y";
    if (dtype != torch::kFloat) continue;
    const auto dy = torch::randn(y.sizes());
    auto dx = torch::full(x.sizes(), std::nanf(""));
    cuda::max_pool_backward(cuda::Dtype::kFloat, dy.data_ptr(), positions.data_ptr<uint8_t>(), shape, dx.data_ptr(), nullptr);
    ry.backward(dy.permute({0, 3, 1, 2}));
    EXPECT_LT(relative_error(dx, rx.grad().permute({0, 2, 3, 1})), 1e-6) << what << ": dx";
  }
}

}  // namespace
