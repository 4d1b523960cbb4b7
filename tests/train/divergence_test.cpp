// The divergence watch on its own: which steps count as diverged, with and without a loss scaler.
#include <gtest/gtest.h>

#include <cmath>

#include "ptrain/precision/loss_scaler.h"
#include "ptrain/train/divergence.h"

namespace {

using ptrain::train::DivergenceWatch;

const auto no_ranks = [](torch::Tensor&) {};

TEST(Divergence, ANonFiniteLossNamesItsStepWithoutAScaler) {
  DivergenceWatch watch(torch::kCPU, /*first_step=*/40, nullptr);
  for (const float loss : {2.3f, 2.1f}) {
    watch.observe_loss(torch::tensor(loss));
    watch.end_step();
  }
  EXPECT_FALSE(watch.read(no_ranks).diverged());
  watch.observe_loss(torch::tensor(1.9f));
  watch.observe_loss(torch::tensor(NAN));  // the second micro-batch of step 43
  watch.end_step();
  watch.observe_loss(torch::tensor(INFINITY));
  watch.end_step();
  const auto status = watch.read(no_ranks);
  ASSERT_TRUE(status.diverged());
  EXPECT_EQ(status.diverged_steps, 2);
  ASSERT_TRUE(status.first_step.has_value());
  EXPECT_EQ(*status.first_step, 43);
  EXPECT_NE(watch.describe(status, 44).find("at step 43: the loss is not finite"), std::string::npos)
      << watch.describe(status, 44);
}

TEST(Divergence, TheRanksSumSaysAnotherRankDiverged) {
  DivergenceWatch watch(torch::kCPU, 0, nullptr);
  watch.observe_loss(torch::tensor(1.0f));
  watch.end_step();
  const auto status = watch.read([](torch::Tensor& t) { t.add_(1); });  // another rank saw one
  ASSERT_TRUE(status.diverged());
  EXPECT_FALSE(status.first_step.has_value());
  EXPECT_NE(watch.describe(status, 1).find("on another rank, at or before step 1"), std::string::npos);
}

// Gradients with an inf, as an overflowing fp16 backward leaves them.
void overflowing_step(ptrain::precision::LossScaler& scaler, DivergenceWatch& watch, float loss) {
  auto grad = torch::tensor({1.0f, INFINITY});
  watch.observe_loss(torch::tensor(loss));
  scaler.unscale_({grad});
  watch.end_step();
  scaler.update();
}

TEST(Divergence, ADynamicScalerSkipsOverflowsUntilItsScaleIsAtTheFloor) {
  ptrain::precision::LossScalerOptions options;
  options.init_scale = 4;
  options.min_scale = 1;
  ptrain::precision::LossScaler scaler(options, torch::kCPU);
  DivergenceWatch watch(torch::kCPU, 0, &scaler);
  overflowing_step(scaler, watch, NAN);  // scale 4 -> 2: a skipped step, even with a NaN loss
  overflowing_step(scaler, watch, 3.0f);  // 2 -> 1
  EXPECT_FALSE(watch.read(no_ranks).diverged());
  overflowing_step(scaler, watch, 3.0f);  // at the floor and still overflowing
  const auto status = watch.read(no_ranks);
  ASSERT_TRUE(status.diverged());
  EXPECT_EQ(*status.first_step, 3);
  EXPECT_NE(watch.describe(status, 3).find("loss scale at its floor (1)"), std::string::npos) << watch.describe(status, 3);
}

TEST(Divergence, WithoutAMinimumTheFloorIsFloat16sSmallestSubnormal) {
  ptrain::precision::LossScalerOptions options;
  options.init_scale = std::ldexp(1.0, -23);
  ptrain::precision::LossScaler scaler(options, torch::kCPU);
  DivergenceWatch watch(torch::kCPU, 0, &scaler);
  overflowing_step(scaler, watch, 1.0f);  // 2^-23 -> 2^-24
  EXPECT_FALSE(watch.read(no_ranks).diverged());
  overflowing_step(scaler, watch, 1.0f);
  EXPECT_TRUE(watch.read(no_ranks).diverged());
}

TEST(Divergence, AStaticScaleSkipsOverflowsButNotANonFiniteLoss) {
  ptrain::precision::LossScalerOptions options;
  options.dynamic = false;
  options.init_scale = 128;
  ptrain::precision::LossScaler scaler(options, torch::kCPU);
  DivergenceWatch watch(torch::kCPU, 0, &scaler);
  overflowing_step(scaler, watch, 2.0f);
  EXPECT_FALSE(watch.read(no_ranks).diverged());
  overflowing_step(scaler, watch, NAN);
  EXPECT_TRUE(watch.read(no_ranks).diverged());
}

}  // namespace
