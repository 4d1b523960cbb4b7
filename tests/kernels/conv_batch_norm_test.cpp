// ResNet's convolutions handing their statistics to its batch norms (MLPerf's fusion, --conv-bn-fusion):
// on the GPU, the batch norm's statistics from a convolution's sums against the statistics pass, and whole
// ResNet-50 and ResNet-18 training steps in fp16 (autocast and pure) with the fusion against the same steps on
// the fused kernels without it. On the CPU: conv_with_stats against LibTorch's convolution, a ResNet asked for
// the fusion where it cannot run computing as before and saying why, and a batch norm refusing statistics it
// cannot take.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "gpu.h"
#include "ptrain/core/cuda_runtime.h"
#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/kernels/conv_stats.h"
#include "ptrain/kernels/fused.h"
#include "ptrain/models/resnet.h"

namespace {

using ptrain::kernels::conv_with_stats;

TEST(ConvBatchNormFusion, ConvWithStatsIsTheConvolutionAndItsSumsWithItsGradients) {
  torch::manual_seed(5);
  const auto x0 = torch::randn({2, 8, 9, 9}, torch::kDouble);
  const auto w0 = torch::randn({16, 8, 3, 3}, torch::kDouble);
  const auto leaf = [](const torch::Tensor& t) { return t.clone().requires_grad_(true); };
  auto x = leaf(x0), w = leaf(w0), x_ref = leaf(x0), w_ref = leaf(w0);
  const auto got = conv_with_stats(x, w, 2, 1);
  const auto want = torch::conv2d(x_ref, w_ref, {}, 2, 1);
  ASSERT_TRUE(torch::allclose(got.y, want, 1e-12, 1e-12));
  // fp32 sums of y (what a batch norm's statistics need), carrying no gradient.
  EXPECT_EQ(got.sum.scalar_type(), torch::kFloat);
  EXPECT_FALSE(got.sum.requires_grad());
  EXPECT_FALSE(got.sum_of_squares.requires_grad());
  EXPECT_TRUE(torch::allclose(got.sum, want.detach().sum({0, 2, 3}).to(torch::kFloat), 1e-5, 1e-4));
  EXPECT_TRUE(torch::allclose(got.sum_of_squares, want.detach().square().sum({0, 2, 3}).to(torch::kFloat), 1e-5, 1e-4));
  const auto dy = torch::randn(want.sizes(), torch::kDouble);
  got.y.backward(dy);
  want.backward(dy);
  EXPECT_TRUE(torch::allclose(x.grad(), x_ref.grad(), 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(w.grad(), w_ref.grad(), 1e-12, 1e-12));
}

std::shared_ptr<ptrain::models::ResNet> make_resnet(int depth, const torch::Device& device, uint64_t seed) {
  torch::manual_seed(seed);
  ptrain::models::ResNetOptions options;
  options.depth = depth;
  options.num_classes = 10;
  auto net = std::make_shared<ptrain::models::ResNet>(options);
  net->to(device);
  for (auto& p : net->parameters())  // as ptrain train --channels-last lays out the weights
    if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
  return net;
}

TEST(ConvBatchNormFusion, ResNetWhereTheFusionCannotRunComputesAsBeforeAndSaysWhy) {
  const torch::Device cpu(torch::kCPU);
  auto asked = make_resnet(18, cpu, 3), plain = make_resnet(18, cpu, 3);
  EXPECT_EQ(asked->describe_conv_bn_fusion(), "off");
  for (auto* net : {asked.get(), plain.get()}) {
    net->set_fused_kernels(true);
    net->set_relu_recompute(true);
  }
  asked->set_conv_bn_fusion(true);
  const auto x = torch::randn({2, 3, 32, 32}).contiguous(at::MemoryFormat::ChannelsLast);
  asked->train();
  plain->train();
  EXPECT_TRUE(torch::equal(asked->forward(x), plain->forward(x)));
  const std::string said = asked->describe_conv_bn_fusion();
  EXPECT_EQ(said.rfind("cuDNN convolution + statistics graphs in 0 of 8 blocks (layer1.0: ", 0), 0u) << said;
  // The replica a one-process data parallel run makes keeps the setting.
  EXPECT_NE(std::dynamic_pointer_cast<ptrain::models::ResNet>(asked->make_replica())->describe_conv_bn_fusion(), "off");
}

TEST(ConvBatchNormFusion, BatchNormRefusesConvolutionStatisticsItCannotTake) {
  ptrain::models::BatchNorm2d norm(8);
  norm->train();
  const auto y = torch::randn({2, 8, 4, 4});
  const ptrain::kernels::ConvStatsResult in{y, y.sum({0, 2, 3}), y.square().sum({0, 2, 3})};
  try {
    norm->forward_relu_from_stats(in);
    FAIL() << "a CPU batch norm without the fusion took a convolution's statistics";
  } catch (const ptrain::Error& e) {
    EXPECT_NE(std::string(e.what()).find("statistics from a convolution are taken only in training with the fused "
                                         "kernels"),
              std::string::npos)
        << e.what();
  }
}

// The statistics from sums against the pass over x (Welford, then Chan's merge): mean, 1/std, scale and shift,
// and the running statistics, for activations with an offset mean (what E[x^2] - E[x]^2 loses precision on).
// With a prologue dtype, scale and shift come back rounded to it, and in it.
TEST(ConvBatchNormFusion, StatisticsFromSumsMatchTheStatisticsPass) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  namespace fused = ptrain::kernels::fused;
  const torch::Device cuda(torch::kCUDA, 0);
  torch::manual_seed(11);
  for (const auto dtype : {torch::kHalf, torch::kBFloat16, torch::kFloat}) {
    const std::string what = c10::toString(dtype);
    const int64_t c = 256;
    const auto x = (torch::randn({16, c, 14, 14}, torch::device(cuda)) * 2 + 3).to(dtype).contiguous(
        at::MemoryFormat::ChannelsLast);
    const auto weight = torch::rand({c}, torch::device(cuda)) + 0.5, bias = torch::randn({c}, torch::device(cuda));
    const auto mean0 = torch::randn({c}, torch::device(cuda)) * 0.1, var0 = torch::rand({c}, torch::device(cuda)) + 0.5;
    auto mean_pass = mean0.clone(), var_pass = var0.clone(), mean_sums = mean0.clone(), var_sums = var0.clone();
    const auto pass = fused::batch_norm_relu_forward(x, {}, weight, bias, mean_pass, var_pass, 0.1, 1e-5, true);
    const auto x32 = x.to(torch::kFloat);
    const auto sums = fused::batch_norm_stats_from_sums(x32.sum({0, 2, 3}), x32.square().sum({0, 2, 3}),
                                                        x.numel() / c, weight, bias, mean_sums, var_sums, 0.1, 1e-5,
                                                        dtype);
    EXPECT_LT(relative_error(sums.mean, pass.mean), 1e-5) << what;
    EXPECT_LT(relative_error(sums.invstd, pass.invstd), 1e-4) << what;
    EXPECT_LT(relative_error(mean_sums, mean_pass), 1e-5) << what;
    EXPECT_LT(relative_error(var_sums, var_pass), 1e-4) << what;
    if (dtype == torch::kFloat) {
      EXPECT_FALSE(sums.scale_shift_io.defined());
      EXPECT_LT(relative_error(sums.scale_shift, pass.scale_shift), 1e-4) << what;
    } else {
      ASSERT_TRUE(sums.scale_shift_io.defined()) << what;
      EXPECT_EQ(sums.scale_shift_io.scalar_type(), dtype);
      EXPECT_TRUE(torch::equal(sums.scale_shift_io.to(torch::kFloat), sums.scale_shift)) << what;
      EXPECT_LT(relative_error(sums.scale_shift, pass.scale_shift), dtype == torch::kHalf ? 1e-3 : 8e-3) << what;
    }
  }
}

// One training step in fp16 with the fusion, and without it (the fused kernels alone), each against the same
// network in fp32 from the same weights (TF32 off): the loss, every gradient and the running statistics. fp16
// rounding at every layer flips the ReLU of pre-activations near zero and moves the gradients of earlier layers
// by percents either way; the fusion differs from the unfused kernels only in rounding (statistics from cuDNN's
// fp32 accumulators before y is rounded, scale and shift rounded to fp16), so its errors must stay within a
// small factor of theirs. A lost or doubled gradient path (the statistics' share of the batch norm's gradient)
// moves the gradients by tens of percent more.
void compare_step(int depth, bool autocast) {
  const std::string what = "resnet" + std::to_string(depth) + (autocast ? " amp-fp16" : " fp16");
  const torch::Device cuda(torch::kCUDA, 0);
  auto fused = make_resnet(depth, cuda, 13), plain = make_resnet(depth, cuda, 13), exact = make_resnet(depth, cuda, 13);
  for (auto* net : {fused.get(), plain.get(), exact.get()}) {
    if (!autocast && net != exact.get()) net->to(torch::kHalf);
    net->set_fused_kernels(true);
    net->set_relu_recompute(true);
    net->train();
  }
  fused->set_conv_bn_fusion(true);
  torch::manual_seed(17);
  // 128 px for ResNet-50: 4x4 positions a sample at its last stage, where 2x2 left its batch norms 64 rows and
  // fp16 moved even the unfused kernels' gradients by 80% from fp32.
  const int64_t size = depth == 50 ? 128 : 64;
  const auto x32 = torch::randn({16, 3, size, size}, torch::device(cuda)).contiguous(at::MemoryFormat::ChannelsLast);
  const auto labels = torch::randint(10, {16}, torch::device(cuda).dtype(torch::kLong));
  std::set<std::string> functions;
  const auto step = [&](ptrain::models::ResNet& net, bool half) {
    const bool cast = half && autocast;
    ptrain::compat::set_autocast_enabled(c10::DeviceType::CUDA, cast);
    auto logits = net.forward(half && !autocast ? x32.to(torch::kHalf) : x32);
    ptrain::compat::set_autocast_enabled(c10::DeviceType::CUDA, false);
    at::autocast::clear_cache();
    auto loss = torch::cross_entropy_loss(logits.to(torch::kFloat), labels);
    if (&net == fused.get()) functions = autograd_functions(loss, {"::ConvWithStats", "::FusedBatchNormReluConvStats"});
    loss.backward();
    return loss.item<double>();
  };
  const bool tf32 = at::globalContext().allowTF32CuDNN();
  at::globalContext().setAllowTF32CuDNN(false);
  const double loss_fused = step(*fused, true), loss_plain = step(*plain, true), loss_exact = step(*exact, false);
  at::globalContext().setAllowTF32CuDNN(tf32);
  const std::string said = fused->describe_conv_bn_fusion();
  const int64_t blocks = depth == 50 ? 16 : 8;
  EXPECT_EQ(said, "cuDNN convolution + statistics graphs in " + std::to_string(blocks) + " of " +
                      std::to_string(blocks) + " blocks")
      << what;
  // Every shortcut batch norm read its convolution's statistics: a --skip-fusions shortcut-norms run would say
  // it measured nothing.
  EXPECT_EQ(fused->fusions_bypassed(), std::vector<std::string>{"shortcut-norms"}) << what;
  EXPECT_TRUE(plain->fusions_bypassed().empty()) << what;
  EXPECT_EQ(functions.size(), 2u) << what << ": the fused functions in the graph: " << c10::Join(", ", functions);
  EXPECT_LT(std::abs(loss_fused - loss_exact), 2 * std::abs(loss_plain - loss_exact) + 1e-3 * loss_exact) << what;
  double worst_fused = 0, worst_plain = 0;
  std::string worst_name;
  const auto plain_parameters = plain->named_parameters(), exact_parameters = exact->named_parameters();
  for (const auto& p : fused->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << what << " " << p.key();
    const auto& want = exact_parameters[p.key()].grad();
    const double error = relative_error(p.value().grad(), want);
    const double plain_error = relative_error(plain_parameters[p.key()].grad(), want);
    if (error > worst_fused) worst_fused = error, worst_name = p.key();
    worst_plain = std::max(worst_plain, plain_error);
    EXPECT_LT(error, 2 * plain_error + 0.02) << what << " " << p.key() << " (unfused kernels: " << plain_error << ")";
  }
  std::cout << "[          ] " << what << ": loss " << loss_fused << " fused, " << loss_plain << " unfused, "
            << loss_exact << " fp32; largest gradient error " << worst_fused << " (" << worst_name << "), unfused "
            << worst_plain << "\n";
  const auto plain_buffers = plain->named_buffers(), exact_buffers = exact->named_buffers();
  for (const auto& b : fused->named_buffers()) {
    if (!b.value().is_floating_point()) continue;
    const auto want = exact_buffers[b.key()].to(torch::kFloat);
    EXPECT_LT(relative_error(b.value(), want), 2 * relative_error(plain_buffers[b.key()], want) + 1e-3)
        << what << " " << b.key();
  }
}

TEST(ConvBatchNormFusion, Fp16ResNetStepsMatchTheUnfusedKernels) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  const int major = ptrain::cuda_runtime::compute_capability(0) / 10;
  if (major != 8 && major != 9) GTEST_SKIP() << "cuDNN's fp16 ConvBNfprop engines are for Ampere and Hopper";
  for (int depth : {50, 18})
    for (bool autocast : {true, false}) compare_step(depth, autocast);
}

// bf16: where cuDNN has no precompiled engine (9.19 on an H200 has none) every block keeps the unfused kernels
// and says why; either way the step matches.
TEST(ConvBatchNormFusion, Bf16BlocksSayWhichPathTheyTook) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  const torch::Device cuda(torch::kCUDA, 0);
  auto net = make_resnet(50, cuda, 13);
  net->to(torch::kBFloat16);
  net->set_fused_kernels(true);
  net->set_relu_recompute(true);
  net->set_conv_bn_fusion(true);
  net->train();
  const auto x = torch::randn({8, 3, 64, 64}, torch::device(cuda).dtype(torch::kBFloat16))
                     .contiguous(at::MemoryFormat::ChannelsLast);
  const auto loss = net->forward(x).to(torch::kFloat).logsumexp(1).mean();
  loss.backward();
  const std::string said = net->describe_conv_bn_fusion();
  std::cout << "[          ] bf16: " << said << "\n";
  EXPECT_EQ(said.rfind("cuDNN convolution + statistics graphs in ", 0), 0u) << said;
  // A block that kept the unfused kernels says why.
  if (said.find(" 16 of 16 blocks") == std::string::npos) {
    EXPECT_NE(said.find(": "), std::string::npos) << said;
  }
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
}

}  // namespace
