// The fused SGD and AdamW steps (at::_fused_sgd_, at::_fused_adamw_) against the foreach reference path,
// element for element within rounding, over several steps, one of them skipped by found_inf.
#include <gtest/gtest.h>

#include "gpu.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/train/optimizer.h"

namespace {

void compare(const std::string& name, torch::ScalarType dtype) {
  const torch::Device cuda(torch::kCUDA, 0);
  ptrain::train::OptimizerOptions c;
  c.kind = name == "adamw" ? ptrain::train::OptimizerKind::adamw : ptrain::train::OptimizerKind::sgd;
  c.lr = name == "adamw" ? 1e-2 : 0.1;
  c.weight_decay = name == "adamw" ? 0.01 : 5e-4;
  c.nesterov = name == "sgd";
  std::vector<torch::Tensor> fused_params, ref_params;
  std::vector<std::string> names;
  for (const auto& shape : {std::vector<int64_t>{3}, std::vector<int64_t>{17, 5}, std::vector<int64_t>{64, 3, 3, 3}}) {
    auto p = torch::randn(shape, torch::dtype(torch::kFloat).device(cuda)).to(dtype);
    fused_params.push_back(p.clone());
    ref_params.push_back(p.clone());
    names.push_back("p" + std::to_string(names.size()));
  }
  auto fused = ptrain::train::make_optimizer(c, fused_params, names, ptrain::train::kOptimizerBatchElements, true);
  auto ref = ptrain::train::make_optimizer(c, ref_params, names, ptrain::train::kOptimizerBatchElements, false);
  ASSERT_EQ(fused->implementation(), "fused");
  ASSERT_TRUE(fused->capturable());
  ASSERT_EQ(ref->implementation(), "foreach");
  // The fused kernels take 1 - beta2 in fp32 (0.00099998713 for 0.999), the foreach path in double: the
  // second moments differ by 1.3e-5 relative, as torch.optim's fused and foreach AdamW do.
  const double tolerance = dtype == torch::kFloat ? 5e-5 : 1e-2;
  for (int step = 0; step < 6; ++step) {
    const auto found_inf = torch::full({}, step == 3 ? 1.0 : 0.0, torch::dtype(torch::kFloat).device(cuda));
    for (size_t i = 0; i < names.size(); ++i) {
      const auto g = torch::randn_like(fused_params[i], torch::kFloat).to(dtype);
      fused_params[i].mutable_grad() = g.clone();
      ref_params[i].mutable_grad() = g.clone();
    }
    const auto before = fused_params[0].clone();
    const double lr = c.lr * (1.0 - 0.1 * step);
    fused->step(lr, &found_inf);
    ref->step(lr, &found_inf);
    for (size_t i = 0; i < names.size(); ++i) {
      EXPECT_LT(relative_error(fused_params[i], ref_params[i]), tolerance)
          << name << " " << c10::toString(dtype) << " step " << step << " " << names[i];
    }
    if (step == 3) { EXPECT_TRUE(torch::equal(before, fused_params[0])) << name << ": a skipped step changed the parameters"; }
    const auto fs = fused->state(), rs = ref->state();
    ASSERT_EQ(fs.size(), rs.size());
    for (size_t k = 0; k < fs.size(); ++k)
      EXPECT_LT(relative_error(fs[k].second, rs[k].second), tolerance) << name << " state " << fs[k].first;
  }
}

TEST(FusedOptimizers, MatchTheForeachPath) {
  PTRAIN_REQUIRE_CUDA_KERNELS();
  if (!ptrain::compat::has_fused_optimizers()) GTEST_SKIP() << "this LibTorch has no fused optimizer kernels";
  torch::manual_seed(7);
  for (const auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) compare("sgd", dtype);
  // Not fp16: there AdamW's foreach path computes sqrt(v) + 1e-8 in fp16, where 1e-8 is 0 and the update
  // divides by zero (pure fp16 trains AdamW with --master-weights); the fused kernel computes in fp32.
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) compare("adamw", dtype);
}

TEST(FusedOptimizers, CpuParametersUseTheForeachPath) {
  ptrain::train::OptimizerOptions c;
  auto p = torch::randn({4});
  auto opt = ptrain::train::make_optimizer(c, {p}, {"p"}, ptrain::train::kOptimizerBatchElements, true);
  EXPECT_EQ(opt->implementation(), "foreach");
  EXPECT_FALSE(opt->capturable());
}

}  // namespace
