#include "ptrain/precision/policy.h"

#include <gtest/gtest.h>

#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"

using ptrain::precision::PrecisionMode;
using ptrain::precision::resolve_precision;

namespace {

constexpr auto kCpu = c10::DeviceType::CPU;
constexpr auto kCuda = c10::DeviceType::CUDA;

// Expects resolve_precision to throw ptrain::Error whose message contains every fragment.
void expect_refused(const std::string& name, bool master, c10::DeviceType device, const std::string& loss_scale,
                    const std::vector<std::string>& fragments) {
  try {
    resolve_precision(name, master, device, loss_scale);
    ADD_FAILURE() << name << " master=" << master << " loss_scale=" << loss_scale << " was accepted";
  } catch (const ptrain::Error& e) {
    for (const auto& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(PrecisionPolicy, Fp32IsFloatEverywhereWithoutTf32) {
  for (const std::string name : {"fp32", "no"}) {
    const auto p = resolve_precision(name, false, kCpu);
    EXPECT_EQ(p.mode, PrecisionMode::FP32);
    EXPECT_EQ(p.name, "fp32");
    EXPECT_EQ(p.param_dtype, c10::kFloat);
    EXPECT_EQ(p.compute_dtype, c10::kFloat);
    EXPECT_EQ(p.reduce_dtype, c10::kFloat);
    EXPECT_EQ(p.master_dtype, c10::kFloat);
    EXPECT_FALSE(p.master_weights || p.autocast || p.loss_scaling || p.allow_tf32);
  }
}

TEST(PrecisionPolicy, Tf32OnlyOnCuda) {
  const auto p = resolve_precision("tf32", false, kCuda);
  EXPECT_TRUE(p.allow_tf32);
  EXPECT_EQ(p.param_dtype, c10::kFloat);
  EXPECT_FALSE(p.autocast);
  expect_refused("tf32", false, kCpu, "auto", {"--precision", "tf32", "CUDA"});
}

TEST(PrecisionPolicy, PureHalfWithAndWithoutMasterWeights) {
  for (const auto& [name, half] : {std::pair{"fp16", c10::kHalf}, std::pair{"bf16", c10::kBFloat16}}) {
    const auto plain = resolve_precision(name, false, kCuda);
    EXPECT_EQ(plain.param_dtype, half);
    EXPECT_EQ(plain.compute_dtype, half);
    EXPECT_EQ(plain.reduce_dtype, half);
    EXPECT_EQ(plain.master_dtype, half);
    EXPECT_FALSE(plain.master_weights);
    EXPECT_FALSE(plain.autocast);

    const auto master = resolve_precision(name, true, kCuda);
    EXPECT_EQ(master.param_dtype, half);
    EXPECT_EQ(master.master_dtype, c10::kFloat);
    EXPECT_TRUE(master.master_weights);
  }
}

TEST(PrecisionPolicy, AmpKeepsFloatParametersAndAutocasts) {
  for (const auto& [name, half] : {std::pair{"amp-fp16", c10::kHalf}, std::pair{"amp-bf16", c10::kBFloat16}}) {
    const auto p = resolve_precision(name, false, kCuda);
    EXPECT_EQ(p.param_dtype, c10::kFloat);
    EXPECT_EQ(p.compute_dtype, c10::kFloat);
    EXPECT_EQ(p.master_dtype, c10::kFloat);
    EXPECT_TRUE(p.autocast);
    EXPECT_EQ(p.autocast_dtype, half);
    EXPECT_FALSE(p.allow_tf32);
  }
}

TEST(PrecisionPolicy, AutoLossScalingFollowsTheFloat16Modes) {
  // Dynamic exactly where float16 gradients can underflow: amp-fp16, and fp16 with a float32 master copy.
  EXPECT_TRUE(resolve_precision("amp-fp16", false, kCuda).loss_scaling);
  EXPECT_TRUE(resolve_precision("amp-fp16", false, kCuda).dynamic_loss_scale);
  EXPECT_TRUE(resolve_precision("fp16", true, kCuda).loss_scaling);
  EXPECT_FALSE(resolve_precision("fp16", false, kCuda).loss_scaling);
  for (const std::string name : {"fp32", "tf32", "amp-bf16"}) {
    EXPECT_FALSE(resolve_precision(name, false, kCuda).loss_scaling) << name;
  }
  EXPECT_FALSE(resolve_precision("bf16", true, kCuda).loss_scaling);
}

TEST(PrecisionPolicy, ExplicitLossScale) {
  const auto none = resolve_precision("amp-fp16", false, kCuda, "none");
  EXPECT_FALSE(none.loss_scaling);
  const auto dynamic = resolve_precision("bf16", false, kCpu, "dynamic");
  EXPECT_TRUE(dynamic.loss_scaling && dynamic.dynamic_loss_scale);
  const auto fixed = resolve_precision("amp-fp16", false, kCuda, "1024");
  EXPECT_TRUE(fixed.loss_scaling);
  EXPECT_FALSE(fixed.dynamic_loss_scale);
  ASSERT_TRUE(fixed.static_loss_scale.has_value());
  EXPECT_EQ(*fixed.static_loss_scale, 1024.0);
  EXPECT_EQ(*resolve_precision("fp16", true, kCuda, "0.5").static_loss_scale, 0.5);
  EXPECT_EQ(*resolve_precision("fp16", true, kCuda, "01024").static_loss_scale, 1024.0);  // decimal, not octal
}

TEST(PrecisionPolicy, BadLossScaleIsRefused) {
  // strtod read 0x400 as 1024: numbers are decimal, as every flag's.
  for (const std::string bad : {"", "abc", "0", "-8", "inf", "nan", "12x", "1e400", "Dynamic", "0x400", "0X1p10"}) {
    expect_refused("amp-fp16", false, kCuda, bad, {"--loss-scale"});
  }
}

TEST(PrecisionPolicy, MasterWeightsOnlyWithPureHalf) {
  for (const std::string name : {"fp32", "tf32", "amp-fp16", "amp-bf16", "fp8"}) {
    expect_refused(name, true, kCuda, "auto", {"--master-weights", name});
  }
}

TEST(PrecisionPolicy, UnknownNameListsTheValidOnes) {
  expect_refused("fp9", false, kCuda, "auto", {"--precision", "fp9", "amp-bf16", "fp8"});
  expect_refused("FP32", false, kCuda, "auto", {"--precision"});
  expect_refused("amp", false, kCuda, "auto", {"--precision"});
}

TEST(PrecisionPolicy, Float16OnTheCpuDependsOnTheRelease) {
  if (ptrain::compat::cpu_autocast_supports_fp16()) {
    EXPECT_EQ(resolve_precision("amp-fp16", false, kCpu).autocast_dtype, c10::kHalf);
    EXPECT_EQ(resolve_precision("fp16", false, kCpu).param_dtype, c10::kHalf);
  } else {
    expect_refused("amp-fp16", false, kCpu, "auto", {"--precision", "amp-bf16"});
    expect_refused("fp16", false, kCpu, "auto", {"--precision", "bf16"});
  }
  EXPECT_EQ(resolve_precision("amp-bf16", false, kCpu).autocast_dtype, c10::kBFloat16);
  EXPECT_EQ(resolve_precision("bf16", true, kCpu).master_dtype, c10::kFloat);
}

TEST(PrecisionPolicy, GlobalMathModeSetsTheTf32Switches) {
  auto& ctx = at::globalContext();
  ptrain::precision::PrecisionPolicy tf32;
  tf32.allow_tf32 = true;
  ptrain::precision::apply_global_math_mode(tf32);
  EXPECT_TRUE(ctx.allowTF32CuBLAS());
  EXPECT_TRUE(ctx.allowTF32CuDNN());
  ptrain::precision::apply_global_math_mode(resolve_precision("fp32", false, kCpu));
  EXPECT_FALSE(ctx.allowTF32CuBLAS());
  EXPECT_FALSE(ctx.allowTF32CuDNN());
}

TEST(PrecisionPolicy, NamesRoundTrip) {
  for (const auto& name : ptrain::precision::precision_names()) {
    EXPECT_EQ(ptrain::precision::to_string(resolve_precision(name, false, kCuda).mode), name);
  }
}

TEST(PrecisionPolicy, Fp8IsAmpBf16WithFp8MatrixProducts) {
  const auto p = resolve_precision("fp8", false, kCuda);
  EXPECT_EQ(p.mode, PrecisionMode::FP8);
  EXPECT_EQ(p.name, "fp8");
  EXPECT_EQ(ptrain::precision::record_name(p), "fp8");
  EXPECT_TRUE(p.fp8_matmuls);
  EXPECT_TRUE(p.autocast);
  EXPECT_EQ(p.autocast_dtype, c10::kBFloat16);
  // fp32 master parameters (the parameters themselves), fp32 gradients and optimizer, no loss scale.
  EXPECT_EQ(p.param_dtype, c10::kFloat);
  EXPECT_EQ(p.compute_dtype, c10::kFloat);
  EXPECT_EQ(p.reduce_dtype, c10::kFloat);
  EXPECT_EQ(p.master_dtype, c10::kFloat);
  EXPECT_FALSE(p.master_weights || p.loss_scaling || p.dynamic_loss_scale || p.allow_tf32);
  EXPECT_EQ(ptrain::precision::half_dtype(PrecisionMode::FP8), c10::kBFloat16);
  EXPECT_TRUE(ptrain::precision::autocasts(PrecisionMode::FP8));
  EXPECT_FALSE(ptrain::precision::half_parameters(PrecisionMode::FP8));
  // The other modes never run FP8 products.
  for (const std::string name : {"fp32", "tf32", "fp16", "bf16", "amp-fp16", "amp-bf16"}) {
    EXPECT_FALSE(resolve_precision(name, false, kCuda).fp8_matmuls) << name;
  }
}

TEST(PrecisionPolicy, Fp8IsRefusedOnTheCpu) {
  expect_refused("fp8", false, kCpu, "auto", {"--precision fp8", "compute capability 8.9", "cpu", "amp-bf16"});
}

TEST(PrecisionPolicy, Fp8IsRefusedWithoutAnFp8LibTorch) {
  const auto p = resolve_precision("fp8", false, kCuda);
  if (ptrain::compat::has_fp8_matmul()) GTEST_SKIP() << "this LibTorch has FP8 matrix products";
  try {
    ptrain::precision::require_fp8_device(p, c10::Device(kCuda, 0));
    ADD_FAILURE() << "fp8 accepted on LibTorch " << ptrain::compat::torch_version();
  } catch (const ptrain::Error& e) {
    const std::string what = e.what();
    for (const std::string& f : {std::string("--precision fp8"), "LibTorch " + ptrain::compat::torch_version(), std::string("2.5"), std::string("amp-bf16")})
      EXPECT_NE(what.find(f), std::string::npos) << what;
  }
}

TEST(PrecisionPolicy, DeviceCheckIgnoresModesWithoutFp8) {
  // amp-bf16 asks nothing of the device: no CUDA query, even in a CPU build.
  EXPECT_NO_THROW(ptrain::precision::require_fp8_device(resolve_precision("amp-bf16", false, kCuda),
                                                        c10::Device(kCuda, 0)));
  EXPECT_NO_THROW(ptrain::precision::require_fp8_device(resolve_precision("fp32", false, kCpu), c10::Device(kCpu)));
}
