#include "ptrain/precision/autocast_guard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"
#include "oracle.h"
#include "temp_dir.h"

using ptrain::precision::AutocastGuard;
namespace compat = ptrain::compat;

namespace {

constexpr auto kCpu = c10::DeviceType::CPU;

torch::Tensor wave(int64_t n, double step, bool cosine, double amplitude) {
  const auto x = torch::arange(n, torch::kFloat) * step;
  return (cosine ? torch::cos(x) : torch::sin(x)) * amplitude;
}

struct AutocastState {
  bool enabled;
  c10::ScalarType dtype;
  bool operator==(const AutocastState& o) const { return enabled == o.enabled && dtype == o.dtype; }
};

AutocastState cpu_state() { return {compat::autocast_enabled(kCpu), compat::autocast_dtype(kCpu)}; }

}  // namespace

TEST(AutocastGuard, MatmulIsBfloat16InsideAndFloatOutside) {
  const auto a = torch::randn({4, 5});
  const auto b = torch::randn({5, 3});
  EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kFloat);
  {
    AutocastGuard guard(kCpu, true, torch::kBFloat16);
    EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(torch::matmul(a, b).scalar_type(), torch::kFloat);
}

TEST(AutocastGuard, InnerDisabledGuardRestoresTheOuterRegion) {
  const auto a = torch::randn({4, 5});
  const auto b = torch::randn({5, 3});
  const AutocastState before = cpu_state();
  {
    AutocastGuard outer(kCpu, true, torch::kBFloat16);
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
    {
      AutocastGuard inner(kCpu, false, torch::kBFloat16);
      EXPECT_FALSE(compat::autocast_enabled(kCpu));
      EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat);
    }
    EXPECT_TRUE(compat::autocast_enabled(kCpu));
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
  }
  EXPECT_TRUE(cpu_state() == before);
}

TEST(AutocastGuard, RestoresANonDefaultPreviousState) {
  compat::set_autocast_enabled(kCpu, true);
  compat::set_autocast_dtype(kCpu, torch::kBFloat16);
  const auto a = torch::randn({4, 5});
  {
    AutocastGuard off(kCpu, false, torch::kFloat);
    EXPECT_FALSE(compat::autocast_enabled(kCpu));
    EXPECT_EQ(torch::mm(a, a.t()).scalar_type(), torch::kFloat);
  }
  EXPECT_TRUE(compat::autocast_enabled(kCpu));
  EXPECT_EQ(compat::autocast_dtype(kCpu), torch::kBFloat16);
  EXPECT_EQ(torch::mm(a, a.t()).scalar_type(), torch::kBFloat16);
  compat::set_autocast_enabled(kCpu, false);
}

TEST(AutocastGuard, RefusedDtypeThrowsAndChangesNothing) {
  if (compat::cpu_autocast_supports_fp16()) GTEST_SKIP() << "this release's CPU autocast accepts float16";
  const AutocastState before = cpu_state();
  try {
    AutocastGuard guard(kCpu, true, torch::kHalf);
    ADD_FAILURE() << "CPU autocast to float16 accepted";
  } catch (const ptrain::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Half"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(cpu_state() == before);
  const auto a = torch::randn({3, 3});
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat);
}

TEST(AutocastGuard, NestingCounterReturnsToZeroAfterTheOuterGuard) {
  // increment_nesting returns the new depth: probing it is the only public read of the counter.
  auto depth = [] {
    const int d = at::autocast::increment_nesting() - 1;
    at::autocast::decrement_nesting();
    return d;
  };
  const int base = depth();
  {
    AutocastGuard outer(kCpu, true, torch::kBFloat16);
    EXPECT_EQ(depth(), base + 1);
    {
      AutocastGuard inner(kCpu, false, torch::kBFloat16);
      EXPECT_EQ(depth(), base + 2);
    }
    EXPECT_EQ(depth(), base + 1);
  }
  EXPECT_EQ(depth(), base);
}

// The same conv/batch_norm/relu/linear/softmax sequence as tests/oracles/precision_autocast.py, under
// our guard here and under torch.autocast("cpu", dtype=torch.bfloat16) there.
TEST(AutocastGuard, OpDtypesAndValuesMatchTorchAutocast) {
  ptrain::testing::TempDir dir;
  const std::string out_path = dir.file("oracle.json");
  const auto oracle_run = ptrain::testing::run_oracle("precision_autocast.py", out_path);
  ASSERT_EQ(oracle_run.exit_code, 0) << oracle_run.output;
  std::ifstream in(out_path);
  const auto oracle = nlohmann::json::parse(in);

  namespace F = torch::nn::functional;
  const auto x = wave(2 * 3 * 8 * 8, 0.1, false, 1.0).reshape({2, 3, 8, 8});
  const auto conv_w = wave(4 * 3 * 3 * 3, 0.37, true, 0.2).reshape({4, 3, 3, 3});
  const auto conv_b = torch::arange(4, torch::kFloat) * 0.01;
  const auto bn_w = torch::full({4}, 1.5);
  const auto bn_b = torch::arange(4, torch::kFloat) * 0.1;
  const auto lin_w = wave(10 * 256, 0.05, false, 0.1).reshape({10, 256});
  const auto lin_b = torch::zeros({10});

  std::vector<std::pair<std::string, torch::Tensor>> ours;
  {
    AutocastGuard guard(kCpu, true, torch::kBFloat16);
    auto y = F::conv2d(x, conv_w, F::Conv2dFuncOptions().bias(conv_b).padding(1));
    ours.emplace_back("conv2d", y);
    y = F::batch_norm(y, torch::zeros({4}), torch::ones({4}),
                      F::BatchNormFuncOptions().weight(bn_w).bias(bn_b).training(true).momentum(0.1).eps(1e-5));
    ours.emplace_back("batch_norm", y);
    y = torch::relu(y);
    ours.emplace_back("relu", y);
    y = F::linear(y.flatten(1), lin_w, lin_b);
    ours.emplace_back("linear", y);
    ours.emplace_back("softmax", torch::softmax(y, 1));
    ours.emplace_back("log_softmax", torch::log_softmax(y, 1));
  }
  ASSERT_EQ(ours.size(), oracle.size());
  for (const auto& [name, tensor] : ours) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(oracle.contains(name));
    EXPECT_EQ(std::string(c10::toString(tensor.scalar_type())), oracle[name]["dtype"].get<std::string>());
    const auto expected = torch::tensor(oracle[name]["values"].get<std::vector<float>>());
    const auto got = tensor.to(torch::kFloat).flatten();
    ASSERT_EQ(got.numel(), expected.numel());
    // bfloat16 keeps 8 significant bits: two units in the last place of the largest values.
    EXPECT_TRUE(torch::allclose(got, expected, /*rtol=*/1.6e-2, /*atol=*/1e-2))
        << "max |diff| " << (got - expected).abs().max().item<float>();
  }
}

TEST(AutocastGuard, CudaRegionIsFloat16AndLeavesTheCpuAlone) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto a = torch::randn({8, 8}, torch::kCUDA);
  {
    AutocastGuard guard(c10::DeviceType::CUDA, true, torch::kHalf);
    EXPECT_FALSE(compat::autocast_enabled(kCpu));
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kHalf);
    {
      AutocastGuard off(c10::DeviceType::CUDA, false, torch::kHalf);
      EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat);
    }
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kHalf);
  }
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat);
}
