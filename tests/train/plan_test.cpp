#include "ptrain/train/plan.h"

#include <gtest/gtest.h>

#include "ptrain/core/error.h"
#include "test_support.h"  // tests/io

namespace {

ptrain::config::TrainConfig cpu_config() {
  ptrain::config::TrainConfig c;
  c.run.device = "cpu";
  return c;
}

std::string plan_error(const ptrain::config::TrainConfig& c) {
  return ptrain::testing::error_message<ptrain::Error>([&] { ptrain::train::make_plan(c); });
}

TEST(Plan, LossScalerRulesNeedADynamicScale) {
  auto c = cpu_config();
  c.precision.hysteresis = 2;  // fp32 has no loss scaling
  const std::string message = plan_error(c);
  EXPECT_NE(message.find("--hysteresis"), std::string::npos) << message;
  EXPECT_NE(message.find("fp32"), std::string::npos) << message;

  const auto plain = ptrain::train::make_plan(cpu_config());  // the defaults are GradScaler's and pass
  EXPECT_EQ(plain.precision.hysteresis, 1);
  EXPECT_EQ(plain.precision.loss_scale_window, 2000);
}

TEST(Plan, WarmupInStepsAndInEpochsExcludeEachOther) {
  auto c = cpu_config();
  c.optim.warmup_steps = 10;
  c.optim.warmup_epochs = 1;
  EXPECT_NE(plan_error(c).find("--warmup-steps"), std::string::npos);
}

TEST(Plan, FsdpSettingsAreRefusedUnderOtherStrategies) {
  auto c = cpu_config();
  c.run.strategy = "ddp";
  c.sharding.auto_wrap = "type";
  EXPECT_NE(plan_error(c).find("--auto-wrap applies to --strategy fsdp only"), std::string::npos) << plan_error(c);
  c = cpu_config();
  c.run.strategy = "zero3";
  c.sharding.param_dtype = "bf16";
  EXPECT_NE(plan_error(c).find("--param-dtype"), std::string::npos) << plan_error(c);
  c = cpu_config();
  c.run.strategy = "fsdp";
  c.sharding.offload_optimizer = true;
  EXPECT_NE(plan_error(c).find("--offload-params moves the optimizer step"), std::string::npos) << plan_error(c);
}

TEST(Plan, FsdpParamDtypeTurnsFp32IntoHalfComputeOnFp32Masters) {
  auto c = cpu_config();
  c.run.strategy = "fsdp";
  c.sharding.param_dtype = "bf16";
  auto plan = ptrain::train::make_plan(c);
  EXPECT_EQ(plan.precision.param_dtype, torch::kBFloat16);
  EXPECT_EQ(plan.precision.compute_dtype, torch::kBFloat16);
  EXPECT_TRUE(plan.precision.master_weights);
  EXPECT_FALSE(plan.precision.autocast);

  c.precision.precision = "amp-bf16";  // accelerate's FSDP with mixed_precision bf16
  c.sharding.buffer_dtype = "bf16";
  plan = ptrain::train::make_plan(c);
  EXPECT_EQ(plan.precision.param_dtype, torch::kBFloat16);
  EXPECT_TRUE(plan.precision.autocast);
  EXPECT_TRUE(plan.precision.master_weights);

  c.sharding.buffer_dtype = "fp32";
  EXPECT_NE(plan_error(c).find("--buffer-dtype fp32"), std::string::npos) << plan_error(c);
}

}  // namespace
