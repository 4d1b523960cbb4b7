// Fused batch norm + ReLU (+ residual) against LibTorch's batch_norm, add and relu in training mode: the
// output, the running statistics and the gradients of x, the residual, weight and bias, in every dtype, for
// ResNet's channel counts and an odd spatial size; the same kernels without the ReLU (a shortcut's batch norm)
// against LibTorch's batch_norm; batch norm + ReLU + convolution with the ReLU's output recomputed in the
// backward against the same without recomputation; the single-pass kernels against the split ones; an output's
// twin (its second use's gradient summed by the backward kernels) against autograd's sum; a whole ResNet-50 step
// on the fused kernels against LibTorch's ops.
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "batch_norm_inputs.h"
#include "gpu.h"
#include "ptrain/kernels/batch_norm_relu.h"
#include "ptrain/kernels/fused.h"
#include "ptrain/models/resnet.h"

namespace {

using ptrain::kernels::batch_norm_relu;
using ptrain::kernels::batch_norm_relu_conv;
using ptrain::kernels::batch_norm_training;
using ptrain::kernels::ConvGeometry;
using ptrain::kernels::fused_batch_norm_relu_applies;
using ptrain::kernels::fused_if;
using ptrain::kernels::KernelPath;
using ptrain::kernels::reference_batch_norm_relu;

using batch_norm_inputs::Inputs;
using batch_norm_inputs::leaves_of;
using batch_norm_inputs::make;

// The fused kernels compute in fp32 and round once; LibTorch's unfused half path rounds the normalised
// value and the sum with the residual each (so the ReLU's mask flips where they round across zero). Both are
// compared with LibTorch in fp32 on the same (upcast) inputs, and the fused error must not exceed the
// unfused one by more than rounding.
// relu false: batch_norm_training against torch::batch_norm (no residual).
void compare(int64_t n, int64_t c, int64_t hw, torch::ScalarType dtype, torch::ScalarType param, bool with_residual,
             bool relu = true) {
  const std::string what = std::to_string(n) + "x" + std::to_string(c) + "x" + std::to_string(hw) + "x" +
                           std::to_string(hw) + " " + c10::toString(dtype) + " params " + c10::toString(param) +
                           (with_residual ? " + residual" : "") + (relu ? "" : " no ReLU");
  const Inputs base = make(n, c, hw, dtype, param, with_residual);
  // A gradient that is not channels-last, as one arriving from a reshaping layer can be.
  const auto dy = torch::randn(base.x.sizes(), base.x.options().dtype(torch::kFloat)).to(dtype).contiguous();
  const auto run = [&](bool fused, torch::ScalarType as, torch::ScalarType param_as, Inputs& in) {
    in = leaves_of(base, as, param_as);  // fresh leaves every run
    torch::Tensor y;
    if (!relu) {
      y = fused ? batch_norm_training(KernelPath::kFused, in.x, in.weight, in.bias, in.running_mean, in.running_var, 0.1,
                                      1e-5)
                : torch::batch_norm(in.x, in.weight, in.bias, in.running_mean, in.running_var, true, 0.1, 1e-5, true);
    } else {
      y = fused ? batch_norm_relu(KernelPath::kFused, in.x, in.residual, in.weight, in.bias, in.running_mean,
                                  in.running_var, 0.1, 1e-5)
                : reference_batch_norm_relu(in.x, in.residual, in.weight, in.bias, in.running_mean, in.running_var,
                                            0.1, 1e-5);
    }
    // The fused path must have run: a fallback to the reference would pass every comparison.
    if (fused) { EXPECT_NE(y.grad_fn()->name().find("Fused"), std::string::npos) << what << ": " << y.grad_fn()->name(); }
    y.backward(dy.to(as));
    return y;
  };
  ASSERT_TRUE(fused_batch_norm_relu_applies(base.x, base.residual, base.weight, base.running_mean))
      << what;
  Inputs f, u, e;
  const auto y_fused = run(true, dtype, param, f);
  const auto y_unfused = run(false, dtype, param, u);
  const auto y_exact = run(false, torch::kFloat, torch::kFloat, e);
  EXPECT_TRUE(y_fused.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
  EXPECT_EQ(y_fused.scalar_type(), dtype) << what;
  const double rounding = dtype == torch::kFloat ? 1e-5 : dtype == torch::kHalf ? 2e-3 : 1e-2;
  const auto check = [&](const torch::Tensor& fused, const torch::Tensor& unfused, const torch::Tensor& exact,
                         const char* name) {
    const double fused_error = relative_error(fused, exact), unfused_error = relative_error(unfused, exact);
    EXPECT_LT(fused_error, std::max(rounding, 1.05 * unfused_error)) << what << ": " << name << " (LibTorch's own "
                                                                      << c10::toString(dtype) << " path: "
                                                                      << unfused_error << ")";
  };
  check(y_fused, y_unfused, y_exact, "y");
  check(f.running_mean, u.running_mean, e.running_mean, "running_mean");
  check(f.running_var, u.running_var, e.running_var, "running_var");
  check(f.x.grad(), u.x.grad(), e.x.grad(), "dx");
  if (with_residual) check(f.residual.grad(), u.residual.grad(), e.residual.grad(), "dresidual");
  check(f.weight.grad(), u.weight.grad(), e.weight.grad(), "dweight");
  check(f.bias.grad(), u.bias.grad(), e.bias.grad(), "dbias");
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

// One training step of ResNet-50 (ImageNet stem: max pooling, every kind of block) with the fused kernels on
// (the shortcuts' batch norms with their blocks' last, the stem's batch norm with its max pooling, recomputed
// ReLUs) against the same network on LibTorch's ops, from
// the same weights, in fp32: the loss, every gradient and the running statistics. The two compute the same
// values in other orders, so a pre-activation within rounding of zero can land on either side of its ReLU (or a
// pooling maximum on another tie) and move the gradients of every earlier layer by about a percent (seen on an
// H200 while these kernels were written: 0.7-1.4% below the first such flip, under 0.1% above it); a lost or
// doubled gradient path moves them by tens of percent.
// A NaN in the activations stays NaN through the fused batch norm + ReLU, as through LibTorch's: its channel's
// statistics are NaN, so every output of that channel is, where fmaxf(NaN, 0) would have made them zeros and hidden
// a diverged step from the loss. With and without a residual, in the shortcut pair, and through the stem's pooling.
TEST(FusedBatchNormRelu, ANaNStaysNaNAsInLibTorch) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  torch::manual_seed(23);
  const int64_t channel = 5;
  const auto with_nan = [&](const torch::Tensor& x) {
    auto y = x.clone();
    y.index_put_({1, channel, 2, 3}, std::numeric_limits<float>::quiet_NaN());
    return y;
  };
  const auto only_that_channel_is_nan = [&](const torch::Tensor& y, const std::string& what) {
    const auto nan = torch::isnan(y.to(torch::kFloat));
    EXPECT_TRUE(nan.select(1, channel).all().item<bool>()) << what << ": its channel is not all NaN";
    EXPECT_EQ(nan.sum().item<int64_t>(), nan.select(1, channel).numel()) << what << ": NaN beyond its channel";
  };
  for (const bool residual : {false, true}) {
    Inputs in = make(4, 16, 8, torch::kBFloat16, torch::kFloat, residual);
    in.x = with_nan(in.x);
    const auto path = fused_if(fused_batch_norm_relu_applies(in.x, in.residual, in.weight, in.running_mean));
    const auto y = batch_norm_relu(path, in.x, in.residual, in.weight, in.bias, in.running_mean.clone(),
                                   in.running_var.clone(), 0.1, 1e-5);
    const auto want = reference_batch_norm_relu(in.x, in.residual, in.weight, in.bias, in.running_mean.clone(),
                                                in.running_var.clone(), 0.1, 1e-5);
    EXPECT_TRUE(torch::equal(torch::isnan(y), torch::isnan(want))) << (residual ? "with" : "without") << " a residual";
    only_that_channel_is_nan(y, residual ? "batch_norm_relu with a residual" : "batch_norm_relu");
  }
  const Inputs a = make(4, 16, 8, torch::kBFloat16, torch::kFloat, false);
  const Inputs b = make(4, 16, 8, torch::kBFloat16, torch::kFloat, false);
  const auto params = [](const Inputs& s) {
    return ptrain::kernels::BatchNormParams{s.weight, s.bias, s.running_mean.clone(), s.running_var.clone(), 0.1, 1e-5};
  };
  only_that_channel_is_nan(
      ptrain::kernels::batch_norm_add_batch_norm_relu(
          fused_if(ptrain::kernels::fused_batch_norm_add_batch_norm_relu_applies(a.x, params(a), b.x, params(b))),
          with_nan(a.x), params(a), b.x, params(b)),
      "the shortcut pair");
  const Inputs stem = make(2, 64, 16, torch::kBFloat16, torch::kFloat, false);
  only_that_channel_is_nan(
      ptrain::kernels::batch_norm_relu_max_pool(
          fused_if(ptrain::kernels::fused_batch_norm_relu_max_pool_applies(stem.x, params(stem), 3, 2, 1)),
          with_nan(stem.x), params(stem), 3, 2, 1),
      "the stem's batch norm + ReLU + pooling");
}

TEST(FusedKernels, ResNet50StepMatchesLibTorchsOps) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  const torch::Device cuda(torch::kCUDA, 0);
  const bool tf32 = at::globalContext().allowTF32CuDNN();
  at::globalContext().setAllowTF32CuDNN(false);
  torch::manual_seed(13);
  ptrain::models::ResNetOptions options;
  options.num_classes = 10;
  auto make_net = [&] {
    auto net = std::make_shared<ptrain::models::ResNet>(options);
    net->to(cuda);
    for (auto& p : net->parameters())  // as ptrain train --channels-last lays out the weights
      if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
    return net;
  };
  auto fused = make_net(), plain = make_net();
  {
    torch::NoGradGuard no_grad;
    const auto from = fused->named_parameters(), from_buffers = fused->named_buffers();
    for (auto& p : plain->named_parameters()) p.value().copy_(from[p.key()]);
    for (auto& b : plain->named_buffers()) b.value().copy_(from_buffers[b.key()]);
  }
  fused->set_fused_kernels(true);
  fused->set_relu_recompute(true);
  plain->set_fused_kernels(false);
  const auto x = torch::randn({8, 3, 64, 64}, torch::device(cuda)).contiguous(at::MemoryFormat::ChannelsLast);
  const auto labels = torch::randint(10, {8}, torch::device(cuda).dtype(torch::kLong));
  std::set<std::string> fused_nodes;  // the fused functions in the fused network's graph
  size_t twins = 0;                   // and those of them that returned a twin of their output
  size_t shortcut_pairs = 0;          // the downsampling blocks' two batch norms in one function, with a twin
  const auto step = [&](ptrain::models::ResNet& net, bool collect) {
    net.train();
    auto loss = torch::cross_entropy_loss(net.forward(x), labels);
    if (collect) {
      fused_nodes = autograd_functions(loss, {"::FusedBatchNormAddRelu", "::FusedBatchNormReluConv",
                                              "::FusedBatchNormReluMaxPool", "::FusedBatchNormAddBatchNormRelu"});
      twins = autograd_functions_with_outputs(loss, "::FusedBatchNormAddRelu", 2);
      shortcut_pairs = autograd_functions_with_outputs(loss, "::FusedBatchNormAddBatchNormRelu", 2);
    }
    loss.backward();
    return loss.item<double>();
  };
  const double loss_fused = step(*fused, true), loss_plain = step(*plain, false);
  // Every fused path ran: a fallback to LibTorch's ops would pass every comparison below.
  EXPECT_EQ(fused_nodes.size(), 4u) << "fused functions found: " << c10::Join(", ", fused_nodes);
  // Every block but the last hands the next one a twin of its output: 15 of ResNet-50's 16, of which the first of
  // each stage (4) ends in its batch norm and its shortcut's as one function.
  EXPECT_EQ(twins, 11u);
  EXPECT_EQ(shortcut_pairs, 4u);
  EXPECT_NEAR(loss_fused, loss_plain, 1e-4 * std::abs(loss_plain));
  const auto plain_parameters = plain->named_parameters();
  for (const auto& p : fused->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_LT(relative_error(p.value().grad(), plain_parameters[p.key()].grad()), 5e-2) << p.key();
  }
  const auto plain_buffers = plain->named_buffers();
  for (const auto& b : fused->named_buffers()) {
    if (!b.value().is_floating_point()) continue;
    EXPECT_LT(relative_error(b.value(), plain_buffers[b.key()]), 1e-4) << b.key();
  }
  at::globalContext().setAllowTF32CuDNN(tf32);
}

// --skip-fusions shortcut-norms,stem-pool,residual-twins on a GPU: ResNet-50's step keeps its other fused
// functions but runs those three paths apart (no pair of batch norms, no stem function, no twin), and its loss is
// the all-fused network's to rounding.
TEST(FusedKernels, SkippedFusionsRunApart) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  const torch::Device cuda(torch::kCUDA, 0);
  torch::manual_seed(17);
  ptrain::models::ResNetOptions options;
  options.num_classes = 10;
  const auto x = torch::randn({4, 3, 64, 64}, torch::device(cuda)).contiguous(at::MemoryFormat::ChannelsLast);
  const auto labels = torch::randint(10, {4}, torch::device(cuda).dtype(torch::kLong));
  const std::vector<std::string> names = {"::FusedBatchNormAddRelu", "::FusedBatchNormReluConv",
                                          "::FusedBatchNormReluMaxPool", "::FusedBatchNormAddBatchNormRelu"};
  std::vector<double> losses;
  for (const bool skip : {false, true}) {
    torch::manual_seed(19);
    ptrain::models::ResNet net(options);
    net.to(cuda);
    for (auto& p : net.parameters())
      if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
    net.set_fused_kernels(true);
    net.set_relu_recompute(true);
    if (skip) net.set_fusions(ptrain::models::fusions_skipping({"shortcut-norms", "stem-pool", "residual-twins"}));
    net.train();
    const auto loss = torch::cross_entropy_loss(net.forward(x), labels);
    const auto found = autograd_functions(loss, names);
    EXPECT_EQ(found.size(), skip ? 2u : 4u) << "fused functions found: " << c10::Join(", ", found);
    EXPECT_EQ(found.count("::FusedBatchNormAddBatchNormRelu") + found.count("::FusedBatchNormReluMaxPool"),
              skip ? 0u : 2u);
    EXPECT_EQ(autograd_functions_with_outputs(loss, "::FusedBatchNormAddRelu", 2), skip ? 0u : 11u);
    losses.push_back(loss.item<double>());
  }
  EXPECT_NEAR(losses[1], losses[0], 1e-3 * std::abs(losses[0]));
}

// The single-pass kernels (one cooperative launch, grid-wide barriers between the passes) against the split
// kernels on the same inputs, each forced. Both merge the same kind of per-chunk partials, in other chunkings
// and orders, so the statistics agree to fp32 rounding and the outputs and gradients to their dtype's; a pass
// that dropped or doubled a chunk, or read coefficients before every block had written its partials, would
// move the statistics by whole percents. The auto choice is covered by the comparisons with LibTorch above.
TEST(FusedBatchNormRelu, SinglePassMatchesTheSplitKernels) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  namespace fused = ptrain::kernels::fused;
  using Passes = fused::BatchNormPasses;
  torch::manual_seed(11);
  struct Case {
    int64_t n, c, hw;
    torch::ScalarType dtype, param;
    bool residual, relu;
  };
  const std::vector<Case> cases = {
      {8, 256, 14, torch::kBFloat16, torch::kFloat, false, true},
      {4, 2048, 7, torch::kBFloat16, torch::kFloat, true, true},    // one block of channel lanes a chunk
      {16, 128, 28, torch::kHalf, torch::kHalf, true, true},        // parameters in fp16
      {3, 24, 9, torch::kFloat, torch::kFloat, false, true},        // odd sizes
      {2, 2048, 7, torch::kFloat, torch::kFloat, true, true},       // fp32: two blocks of channel lanes
      {8, 512, 7, torch::kBFloat16, torch::kFloat, false, false},   // a shortcut's: no ReLU
      {128, 64, 56, torch::kBFloat16, torch::kFloat, false, true},  // larger than auto takes: hundreds of chunks
  };
  for (const Case& k : cases) {
    const std::string what = std::to_string(k.n) + "x" + std::to_string(k.c) + "x" + std::to_string(k.hw) + " " +
                             c10::toString(k.dtype) + (k.residual ? " + residual" : "") + (k.relu ? "" : " no ReLU");
    const Inputs in = make(k.n, k.c, k.hw, k.dtype, k.param, k.residual);
    const auto dy = torch::randn(in.x.sizes(), in.x.options()).contiguous(at::MemoryFormat::ChannelsLast);
    struct Run {
      fused::BatchNormReluForward forward;
      fused::BatchNormReluBackward backward;
      torch::Tensor running_mean, running_var;
    };
    const auto run = [&](Passes passes) {
      Run r;
      r.running_mean = in.running_mean.clone();
      r.running_var = in.running_var.clone();
      r.forward = fused::batch_norm_relu_forward(in.x, in.residual, in.weight, in.bias, r.running_mean, r.running_var,
                                                 0.1, 1e-5, k.relu, passes);
      r.backward = fused::batch_norm_relu_backward(dy, torch::Tensor(), r.forward.y, in.x, r.forward.mean, r.forward.invstd,
                                                   r.forward.scale_shift, in.weight, k.residual, k.relu, passes);
      EXPECT_EQ(r.forward.single_pass, passes == Passes::kSinglePass) << what;
      EXPECT_EQ(r.backward.single_pass, passes == Passes::kSinglePass) << what;
      return r;
    };
    const Run split = run(Passes::kSplit), single = run(Passes::kSinglePass);
    const double fp32 = 1e-5;
    const double io = k.dtype == torch::kFloat ? 1e-5 : k.dtype == torch::kHalf ? 2e-3 : 1e-2;
    const double param = k.param == torch::kFloat ? fp32 : io;
    EXPECT_LT(relative_error(single.forward.mean, split.forward.mean), fp32) << what << ": mean";
    EXPECT_LT(relative_error(single.forward.invstd, split.forward.invstd), fp32) << what << ": invstd";
    EXPECT_LT(relative_error(single.running_mean, split.running_mean), param) << what << ": running_mean";
    EXPECT_LT(relative_error(single.running_var, split.running_var), param) << what << ": running_var";
    // Elementwise, a few elements may differ by more: a pre-activation within rounding of zero takes the ReLU's
    // other side when scale and shift differ in their last bit.
    const auto differing = [&](const torch::Tensor& got, const torch::Tensor& want) {
      const auto g = got.to(torch::kDouble), w = want.to(torch::kDouble);
      return (g - w).abs().gt(io * (w.abs() + 1)).sum().item<int64_t>();
    };
    const int64_t allowed = std::max<int64_t>(2, in.x.numel() / 100000);
    EXPECT_LE(differing(single.forward.y, split.forward.y), allowed) << what << ": y";
    EXPECT_LE(differing(single.backward.dx, split.backward.dx), allowed) << what << ": dx";
    if (k.residual) { EXPECT_LE(differing(single.backward.dresidual, split.backward.dresidual), allowed) << what; }
    const double sums = std::max(param, 1e-4);  // one flipped mask moves a channel's sums by one element
    EXPECT_LT(relative_error(single.backward.dweight, split.backward.dweight), sums) << what << ": dweight";
    EXPECT_LT(relative_error(single.backward.dbias, split.backward.dbias), sums) << what << ": dbias";
    // Not merely equal to each other: the mean against LibTorch's.
    EXPECT_LT(relative_error(single.forward.mean, in.x.to(torch::kFloat).mean({0, 2, 3})), 1e-4) << what;
  }
}

// A mean far from zero beside its spread (1000 and 0.1: the mean squared is 1e8 variances), where sums of x and x^2
// in fp32 lose the variance entirely: both reductions, split and single pass, against LibTorch's in double. A
// reduction that shifts its values must shift them by a value of the data, not by zero.
TEST(FusedBatchNormRelu, StatisticsHoldForAMeanFarFromZero) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  namespace fused = ptrain::kernels::fused;
  using Passes = fused::BatchNormPasses;
  torch::manual_seed(12);
  const torch::Device cuda(torch::kCUDA, 0);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    // In bf16 1000 +- 0.1 would round to a few values; bf16 takes 10 +- 0.1 (a mean squared of 1e4 variances).
    const double offset = dtype == torch::kFloat ? 1000.0 : 10.0, spread = 0.1;
    const auto x = (torch::randn({16, 256, 14, 14}, torch::device(cuda)) * spread + offset)
                       .to(dtype)
                       .contiguous(at::MemoryFormat::ChannelsLast);
    const auto exact = x.to(torch::kDouble);
    const auto want_mean = exact.mean({0, 2, 3});
    const auto want_var = exact.var({0, 2, 3}, /*unbiased=*/false);
    const auto weight = torch::ones({256}, torch::device(cuda)), bias = torch::zeros({256}, torch::device(cuda));
    for (const Passes passes : {Passes::kSplit, Passes::kSinglePass}) {
      const std::string what = std::string(c10::toString(dtype)) + (passes == Passes::kSplit ? " split" : " single pass");
      const auto running_mean = torch::zeros({256}, torch::device(cuda)), running_var = torch::ones({256}, torch::device(cuda));
      const auto got = fused::batch_norm_relu_forward(x, torch::Tensor(), weight, bias, running_mean, running_var, 0.1,
                                                      1e-5, /*relu=*/false, passes);
      ASSERT_EQ(got.single_pass, passes == Passes::kSinglePass) << what;
      const double mean_error =
          (got.mean.to(torch::kCPU, torch::kDouble) - want_mean.cpu()).abs().max().item<double>() / spread;
      // fp32 spaces values near 1000 6.1e-5 apart (6e-4 standard deviations): a few of those steps.
      EXPECT_LT(mean_error, 1e-2) << what << ": the mean, in standard deviations";
      const auto var = 1.0 / got.invstd.to(torch::kCPU, torch::kDouble).square() - 1e-5;
      EXPECT_LT(relative_error(var, want_var), 1e-3) << what << ": the variance";
    }
  }
}

// An output with a twin (a block's, used by the next block's convolution and its shortcut): the backward takes
// the gradients of the two uses apart and sums them as it reads them, where autograd would add them in a pass of
// its own. The same losses through the twin and through the output used twice must give the same gradients, up
// to the rounding of autograd's sum to the dtype (the kernels sum in fp32); and the launchers with a second
// gradient, split and single pass, must match them given the sum.
TEST(FusedBatchNormRelu, TwinHandsTheSecondUsesGradientToTheKernels) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  namespace fused = ptrain::kernels::fused;
  using Passes = fused::BatchNormPasses;
  torch::manual_seed(12);
  for (const auto dtype : {torch::kBFloat16, torch::kHalf, torch::kFloat}) {
    for (const int64_t c : {64, 2048}) {
      const std::string what = std::string(c10::toString(dtype)) + " " + std::to_string(c) + " channels";
      const Inputs base = make(8, c, c == 64 ? 28 : 7, dtype, torch::kFloat, /*residual=*/true);
      const auto w1 = torch::randn(base.x.sizes(), base.x.options().dtype(torch::kFloat));
      const auto w2 = torch::randn(base.x.sizes(), base.x.options().dtype(torch::kFloat));
      const auto run = [&](bool with_twin, Inputs& in) {
        in = leaves_of(base, dtype, torch::kFloat);
        torch::Tensor twin;
        const auto y = batch_norm_relu(KernelPath::kFused, in.x, in.residual, in.weight, in.bias, in.running_mean,
                                       in.running_var, 0.1, 1e-5, with_twin ? &twin : nullptr);
        if (with_twin) {
          EXPECT_TRUE(twin.defined()) << what;
          if (!twin.defined()) return;
          EXPECT_EQ(twin.data_ptr(), y.data_ptr()) << what << ": the twin is the output's memory";
          EXPECT_EQ(twin.grad_fn().get(), y.grad_fn().get()) << what << ": the twin is the same function's output";
          EXPECT_EQ(twin.output_nr(), 1u) << what;
        }
        const auto& second = with_twin ? twin : y;
        ((y.to(torch::kFloat) * w1).sum() + (second.to(torch::kFloat) * w2).sum()).backward();
      };
      Inputs a, b;
      run(true, a);
      run(false, b);
      const double io = dtype == torch::kFloat ? 1e-5 : dtype == torch::kHalf ? 2e-3 : 1e-2;
      EXPECT_LT(relative_error(a.x.grad(), b.x.grad()), io) << what << ": dx";
      EXPECT_LT(relative_error(a.residual.grad(), b.residual.grad()), io) << what << ": dresidual";
      EXPECT_LT(relative_error(a.weight.grad(), b.weight.grad()), io) << what << ": dweight";
      EXPECT_LT(relative_error(a.bias.grad(), b.bias.grad()), io) << what << ": dbias";

      // The launchers, each path forced: (dy, dy2) against dy + dy2 summed beforehand.
      auto mean = base.running_mean.clone(), var = base.running_var.clone();
      const auto f = fused::batch_norm_relu_forward(base.x, base.residual, base.weight, base.bias, mean, var, 0.1,
                                                    1e-5, /*relu=*/true);
      const auto cl = at::MemoryFormat::ChannelsLast;
      const auto dy = w1.to(dtype).contiguous(cl), dy2 = w2.to(dtype).contiguous(cl);
      const auto sum = (dy.to(torch::kFloat) + dy2.to(torch::kFloat)).to(dtype).contiguous(cl);
      for (const Passes passes : {Passes::kSplit, Passes::kSinglePass}) {
        const std::string how = what + (passes == Passes::kSplit ? " split" : " single pass");
        const auto two = fused::batch_norm_relu_backward(dy, dy2, f.y, base.x, f.mean, f.invstd, f.scale_shift,
                                                         base.weight, true, true, passes);
        const auto one = fused::batch_norm_relu_backward(sum, torch::Tensor(), f.y, base.x, f.mean, f.invstd,
                                                         f.scale_shift, base.weight, true, true, passes);
        EXPECT_EQ(two.single_pass, passes == Passes::kSinglePass) << how;
        EXPECT_LT(relative_error(two.dx, one.dx), io) << how << ": dx";
        EXPECT_LT(relative_error(two.dresidual, one.dresidual), io) << how << ": dresidual";
        EXPECT_LT(relative_error(two.dweight, one.dweight), std::max(io, 1e-4)) << how << ": dweight";
        EXPECT_LT(relative_error(two.dbias, one.dbias), std::max(io, 1e-4)) << how << ": dbias";
        // Not merely equal: the sum of the gradients differs from either one by far more than rounding.
        const auto only_dy = fused::batch_norm_relu_backward(dy, torch::Tensor(), f.y, base.x, f.mean, f.invstd,
                                                             f.scale_shift, base.weight, true, true, passes);
        EXPECT_GT(relative_error(only_dy.dx, one.dx), 0.1) << how;
      }
    }
  }
}

TEST(FusedBatchNorm, WithoutTheReluMatchesLibTorchsBatchNorm) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  torch::manual_seed(10);
  for (const auto dtype : {torch::kBFloat16, torch::kHalf, torch::kFloat}) {
    compare(4, 256, 7, dtype, torch::kFloat, false, /*relu=*/false);
    compare(2, 2048, 7, dtype, torch::kFloat, false, /*relu=*/false);
    compare(3, 24, 9, dtype, torch::kFloat, false, /*relu=*/false);
  }
  compare(16, 128, 28, torch::kBFloat16, torch::kBFloat16, false, /*relu=*/false);
  compare(128, 256, 28, torch::kBFloat16, torch::kFloat, false, /*relu=*/false);  // many rows a chunk: the unrolled loops
}

// batch_norm_relu_conv keeps x, not the ReLU's output, and recomputes that for the convolution's backward:
// with cuDNN deterministic, every output and gradient must be bit for bit those of the fused batch norm + ReLU
// followed by LibTorch's conv2d (which keeps the output).
void compare_recompute(int64_t n, int64_t c, int64_t hw, int64_t out_channels, int64_t kernel, int64_t stride,
                       torch::ScalarType dtype) {
  const std::string what = std::to_string(n) + "x" + std::to_string(c) + "x" + std::to_string(hw) + " conv " +
                           std::to_string(kernel) + "x" + std::to_string(kernel) + "/" + std::to_string(stride) +
                           " to " + std::to_string(out_channels) + " " + c10::toString(dtype);
  const Inputs base = make(n, c, hw, dtype, torch::kFloat, false);
  const torch::Device cuda(torch::kCUDA, 0);
  const auto conv_weight = (torch::randn({out_channels, c, kernel, kernel}, torch::device(cuda)) * 0.05)
                               .contiguous(at::MemoryFormat::ChannelsLast);
  ConvGeometry geometry;
  geometry.stride = {stride, stride};
  geometry.padding = {kernel / 2, kernel / 2};
  struct Run {
    Inputs in;
    torch::Tensor conv_weight, out;
  };
  const auto run = [&](bool recompute) {
    const auto leaf = [](const torch::Tensor& t) { return t.detach().clone().requires_grad_(true); };
    Run r;
    r.in.x = leaf(base.x);
    r.in.weight = leaf(base.weight);
    r.in.bias = leaf(base.bias);
    r.in.running_mean = base.running_mean.clone();
    r.in.running_var = base.running_var.clone();
    r.conv_weight = leaf(conv_weight);
    const auto w = r.conv_weight.to(dtype);  // as autocast casts it
    const auto path = fused_if(fused_batch_norm_relu_applies(r.in.x, {}, r.in.weight, r.in.running_mean));
    if (recompute) {
      r.out = batch_norm_relu_conv(path, r.in.x, r.in.weight, r.in.bias, r.in.running_mean, r.in.running_var, 0.1, 1e-5,
                                   w, geometry);
    } else {
      const auto y = batch_norm_relu(path, r.in.x, {}, r.in.weight, r.in.bias, r.in.running_mean, r.in.running_var,
                                     0.1, 1e-5);
      r.out = torch::conv2d(y, w, {}, geometry.stride, geometry.padding);
    }
    torch::manual_seed(3);
    r.out.backward(torch::randn(r.out.sizes(), r.out.options()));
    return r;
  };
  const Run a = run(true), b = run(false);
  EXPECT_EQ(a.out.scalar_type(), dtype) << what;
  EXPECT_TRUE(torch::equal(a.out, b.out)) << what << ": output";
  EXPECT_TRUE(torch::equal(a.in.running_mean, b.in.running_mean)) << what << ": running_mean";
  EXPECT_TRUE(torch::equal(a.in.running_var, b.in.running_var)) << what << ": running_var";
  EXPECT_TRUE(torch::equal(a.in.x.grad(), b.in.x.grad())) << what << ": dx";
  EXPECT_TRUE(torch::equal(a.in.weight.grad(), b.in.weight.grad())) << what << ": dweight";
  EXPECT_TRUE(torch::equal(a.in.bias.grad(), b.in.bias.grad())) << what << ": dbias";
  EXPECT_TRUE(torch::equal(a.conv_weight.grad(), b.conv_weight.grad())) << what << ": dconv_weight";
}

TEST(FusedBatchNormReluConv, RecomputesTheReluOutputWithTheSameNumbers) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  const bool deterministic = at::globalContext().deterministicCuDNN();
  at::globalContext().setDeterministicCuDNN(true);
  torch::manual_seed(11);
  for (const auto dtype : {torch::kBFloat16, torch::kHalf, torch::kFloat}) {
    compare_recompute(4, 64, 14, 64, 3, 1, dtype);     // a bottleneck's 3x3
    compare_recompute(8, 128, 9, 32, 3, 2, dtype);     // strided, odd size
    compare_recompute(2, 256, 7, 1024, 1, 1, dtype);   // a bottleneck's expanding 1x1
    compare_recompute(3, 24, 9, 8, 1, 1, dtype);       // channels not a multiple of a warp's lanes
  }
  at::globalContext().setDeterministicCuDNN(deterministic);
}

TEST(FusedBatchNormReluConv, CpuTensorsTakeTheReferenceOps) {
  torch::manual_seed(2);
  const auto x = torch::randn({2, 8, 5, 5});
  const auto w = torch::rand({8}) + 0.5, b = torch::randn({8}), cw = torch::randn({4, 8, 3, 3});
  auto mean_a = torch::zeros({8}), var_a = torch::ones({8}), mean_b = mean_a.clone(), var_b = var_a.clone();
  ConvGeometry geometry;
  geometry.padding = {1, 1};
  const auto path = fused_if(fused_batch_norm_relu_applies(x, {}, w, mean_a));
  EXPECT_EQ(path, KernelPath::kReference);
  const auto got = batch_norm_relu_conv(path, x, w, b, mean_a, var_a, 0.1, 1e-5, cw, geometry);
  const auto want = torch::conv2d(reference_batch_norm_relu(x, {}, w, b, mean_b, var_b, 0.1, 1e-5), cw, {}, 1, 1);
  EXPECT_TRUE(torch::allclose(got, want));
  EXPECT_TRUE(torch::equal(mean_a, mean_b));
}

TEST(FusedBatchNormRelu, RefusesWhatTheKernelsCannotTake) {
  const auto x = torch::randn({2, 6, 4, 4});
  const auto w = torch::ones({6});
  EXPECT_FALSE(fused_batch_norm_relu_applies(x, {}, w, w));  // CPU, and 6 channels
  if (!torch::cuda::is_available()) return;
  const torch::Device cuda(torch::kCUDA, 0);
  const auto nchw = torch::randn({2, 64, 4, 4}, torch::device(cuda)).to(torch::kBFloat16);
  const auto w64 = torch::ones({64}, torch::device(cuda));
  EXPECT_FALSE(fused_batch_norm_relu_applies(nchw, {}, w64, w64));  // not channels-last
  EXPECT_TRUE(fused_batch_norm_relu_applies(nchw.contiguous(at::MemoryFormat::ChannelsLast), {}, w64, w64));
}

}  // namespace
