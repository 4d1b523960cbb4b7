// relu(bn(x) + bn2(x2)), a downsampling ResNet block's last batch norm with its shortcut's, as one fused function
// (kernels::batch_norm_add_batch_norm_relu) against LibTorch's batch norms, add and ReLU: the output, both running
// statistics and every gradient, with and without a twin of the output, in every dtype; and the kernels' choice
// of the single cooperative launch, each way.
#include <string>

#include <gtest/gtest.h>

#include "batch_norm_inputs.h"
#include "gpu.h"
#include "ptrain/kernels/batch_norm_relu.h"
#include "ptrain/kernels/fused.h"

namespace {

using ptrain::kernels::batch_norm_add_batch_norm_relu;
using ptrain::kernels::BatchNormParams;

using batch_norm_inputs::Inputs;
using batch_norm_inputs::leaves_of;
using batch_norm_inputs::make;

BatchNormParams params_of(const Inputs& s) { return {s.weight, s.bias, s.running_mean, s.running_var, 0.1, 1e-5}; }

void compare_pair(int64_t n, int64_t c, int64_t hw, torch::ScalarType dtype, torch::ScalarType param, bool twin) {
  const std::string what = std::to_string(n) + "x" + std::to_string(c) + "x" + std::to_string(hw) + " " +
                           c10::toString(dtype) + " params " + c10::toString(param) + (twin ? " with a twin" : "");
  const Inputs base = make(n, c, hw, dtype, param, false), base2 = make(n, c, hw, dtype, param, false, -1.0);
  const auto dy = torch::randn(base.x.sizes(), base.x.options().dtype(torch::kFloat)).to(dtype).contiguous();
  const auto dy2 = torch::randn(base.x.sizes(), base.x.options().dtype(torch::kFloat)).to(dtype);
  struct Run {
    Inputs a, b;
    torch::Tensor y;
  };
  const auto run = [&](bool fused, torch::ScalarType as, torch::ScalarType param_as) {
    Run r{leaves_of(base, as, param_as), leaves_of(base2, as, param_as), {}};
    torch::Tensor second;
    r.y = batch_norm_add_batch_norm_relu(ptrain::kernels::fused_if(fused), r.a.x, params_of(r.a), r.b.x, params_of(r.b),
                                         twin ? &second : nullptr);
    if (fused) {
      EXPECT_TRUE(ends_with(r.y.grad_fn()->name(), "FusedBatchNormAddBatchNormRelu") ||
                  ends_with(r.y.grad_fn()->name(), "FusedBatchNormAddBatchNormRelu>"))
          << what << ": " << r.y.grad_fn()->name();
      EXPECT_EQ(second.defined(), twin) << what;
    }
    // The output's two uses: through the twin where there is one, else through the output itself.
    const auto& other = second.defined() ? second : r.y;
    auto loss = (r.y.to(torch::kFloat) * dy.to(torch::kFloat)).sum();
    if (twin) loss = loss + (other.to(torch::kFloat) * dy2.to(torch::kFloat)).sum();
    loss.backward();
    return r;
  };
  ASSERT_TRUE(ptrain::kernels::fused_batch_norm_add_batch_norm_relu_applies(base.x, params_of(base), base2.x,
                                                                            params_of(base2)))
      << what;
  const Run f = run(true, dtype, param), u = run(false, dtype, param), e = run(false, torch::kFloat, torch::kFloat);
  EXPECT_TRUE(f.y.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
  EXPECT_EQ(f.y.scalar_type(), dtype) << what;
  const double rounding = dtype == torch::kFloat ? 1e-5 : dtype == torch::kHalf ? 2e-3 : 1e-2;
  const auto check = [&](const torch::Tensor& fused, const torch::Tensor& unfused, const torch::Tensor& exact,
                         const char* name) {
    const double fused_error = relative_error(fused, exact), unfused_error = relative_error(unfused, exact);
    EXPECT_LT(fused_error, std::max(rounding, 1.05 * unfused_error))
        << what << ": " << name << " (LibTorch's own " << c10::toString(dtype) << " path: " << unfused_error << ")";
  };
  check(f.y, u.y, e.y, "y");
  check(f.a.running_mean, u.a.running_mean, e.a.running_mean, "running_mean");
  check(f.a.running_var, u.a.running_var, e.a.running_var, "running_var");
  check(f.b.running_mean, u.b.running_mean, e.b.running_mean, "shortcut running_mean");
  check(f.b.running_var, u.b.running_var, e.b.running_var, "shortcut running_var");
  check(f.a.x.grad(), u.a.x.grad(), e.a.x.grad(), "dx");
  check(f.b.x.grad(), u.b.x.grad(), e.b.x.grad(), "shortcut dx");
  check(f.a.weight.grad(), u.a.weight.grad(), e.a.weight.grad(), "dweight");
  check(f.a.bias.grad(), u.a.bias.grad(), e.a.bias.grad(), "dbias");
  check(f.b.weight.grad(), u.b.weight.grad(), e.b.weight.grad(), "shortcut dweight");
  check(f.b.bias.grad(), u.b.bias.grad(), e.b.bias.grad(), "shortcut dbias");
}

TEST(FusedShortcutBatchNorm, MatchesLibTorchInEveryDtype) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  torch::manual_seed(17);
  compare_pair(8, 256, 14, torch::kBFloat16, torch::kFloat, false);
  compare_pair(4, 2048, 7, torch::kBFloat16, torch::kFloat, true);   // ResNet-50's last stage, a twin
  compare_pair(16, 128, 28, torch::kHalf, torch::kHalf, true);       // parameters in fp16
  compare_pair(3, 24, 9, torch::kFloat, torch::kFloat, false);       // odd sizes
  compare_pair(2, 2048, 7, torch::kFloat, torch::kFloat, true);      // fp32: two blocks of channel lanes
  compare_pair(32, 256, 56, torch::kBFloat16, torch::kFloat, true);  // layer1's shape: hundreds of rows a chunk
}

// The kernels read a side's bias and running variance in its weight's dtype: parameters of mixed dtypes, or a
// batch norm without a bias, take the unfused path.
TEST(FusedShortcutBatchNorm, RefusesParametersOfMixedDtypes) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  const Inputs a = make(4, 64, 8, torch::kBFloat16, torch::kFloat, false);
  const Inputs b = make(4, 64, 8, torch::kBFloat16, torch::kFloat, false);
  using ptrain::kernels::fused_batch_norm_add_batch_norm_relu_applies;
  ASSERT_TRUE(fused_batch_norm_add_batch_norm_relu_applies(a.x, params_of(a), b.x, params_of(b)));
  auto mixed = params_of(b);
  mixed.bias = mixed.bias.to(torch::kBFloat16);
  EXPECT_FALSE(fused_batch_norm_add_batch_norm_relu_applies(a.x, params_of(a), b.x, mixed));
  mixed = params_of(b);
  mixed.running_var = mixed.running_var.to(torch::kHalf);
  EXPECT_FALSE(fused_batch_norm_add_batch_norm_relu_applies(a.x, mixed, b.x, params_of(b)));
  mixed = params_of(a);
  mixed.bias = torch::Tensor();
  EXPECT_FALSE(fused_batch_norm_add_batch_norm_relu_applies(a.x, mixed, b.x, params_of(b)));
}

// At ResNet-50's four downsampling shapes (batch 32) the fused function runs one cooperative launch each way.
TEST(FusedShortcutBatchNorm, RunsAsOneLaunchEachWayAtResNetShapes) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  namespace fused = ptrain::kernels::fused;
  torch::manual_seed(19);
  const int64_t shapes[][2] = {{256, 56}, {512, 28}, {1024, 14}, {2048, 7}};
  for (const auto& shape : shapes) {
    const Inputs a = make(32, shape[0], shape[1], torch::kBFloat16, torch::kFloat, false, 1.0);
    const Inputs b = make(32, shape[0], shape[1], torch::kBFloat16, torch::kFloat, false, 0.0);
    const auto forward = fused::batch_norm_add_batch_norm_relu_forward(a.x, params_of(a), b.x, params_of(b));
    EXPECT_TRUE(forward.single_pass) << shape[0] << " channels";
    const auto dy = torch::randn_like(forward.y);
    const auto backward = fused::batch_norm_add_batch_norm_relu_backward(dy, dy, forward.y, a.x, b.x, forward.stats,
                                                                         forward.stats2, a.weight, b.weight);
    EXPECT_TRUE(backward.single_pass) << shape[0] << " channels";
    // Both sides' bias gradients are the sum of the masked gradient.
    EXPECT_TRUE(torch::allclose(backward.dbias, backward.dbias2)) << shape[0] << " channels";
  }
}

}  // namespace
