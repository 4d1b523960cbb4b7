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
}

TEST(PrecisionPolicy, BadLossScaleIsRefused) {
  for (const std::string bad : {"", "abc", "0", "-8", "inf", "nan", "12x", "1e400", "Dynamic"}) {
    expect_refused("amp-fp16", false, kCuda, bad, {"--loss-scale"});
  }
}

TEST(PrecisionPolicy, MasterWeightsOnlyWithPureHalf) {
  for (const std::string name : {"fp32", "tf32", "amp-fp16", "amp-bf16"}) {
    expect_refused(name, true, kCuda, "auto", {"--master-weights", name});
  }
}

TEST(PrecisionPolicy, UnknownNameListsTheValidOnes) {
  expect_refused("fp8", false, kCuda, "auto", {"--precision", "fp8", "amp-bf16"});
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
