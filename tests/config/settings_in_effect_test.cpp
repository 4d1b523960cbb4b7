// A setting the run's strategy would accept and ignore is refused by name, with the reason.
#include "ptrain/config/settings_in_effect.h"

#include <gtest/gtest.h>

#include "ptrain/core/error.h"
#include "test_support.h"

namespace {

using ptrain::config::TrainConfig;

TrainConfig under(const std::string& strategy) {
  TrainConfig c;
  c.run.strategy = strategy;
  return c;
}

std::string refusal(const TrainConfig& c) {
  try {
    ptrain::config::refuse_settings_without_effect(c);
  } catch (const ptrain::Error& e) {
    return e.what();
  }
  return "";
}

TEST(SettingsInEffect, DefaultsPassUnderEveryStrategy) {
  for (const char* s : {"single", "dp", "ddp", "zero1", "zero2", "zero3", "fsdp"}) EXPECT_EQ(refusal(under(s)), "") << s;
}

// Each optimizer's and schedule's own settings act under it only; under another they are refused by name,
// as --milestones without --schedule step is, and under their own they pass.
TEST(SettingsInEffect, OptimizerAndScheduleSettingsOnlyWhereTheyAct) {
  TrainConfig adamw;
  adamw.optim.name = "adamw";
  adamw.optim.momentum = 0.5;
  EXPECT_EQ(refusal(adamw), "--momentum applies to --optimizer sgd (this run's optimizer is adamw); adamw's moments "
                            "take --beta1 and --beta2");
  adamw.optim.momentum = TrainConfig{}.optim.momentum;
  adamw.optim.nesterov = true;
  EXPECT_EQ(refusal(adamw), "--nesterov applies to --optimizer sgd (this run's optimizer is adamw)");
  adamw.optim.nesterov = false;
  adamw.optim.eps = 1e-6;
  adamw.optim.beta2 = 0.95;
  EXPECT_EQ(refusal(adamw), "");

  TrainConfig sgd;
  sgd.optim.eps = 1e-6;
  EXPECT_EQ(refusal(sgd), "--eps applies to --optimizer adamw (this run's optimizer is sgd)");
  sgd.optim.eps = TrainConfig{}.optim.eps;
  sgd.optim.beta1 = 0.8;
  EXPECT_EQ(refusal(sgd), "--beta1 applies to --optimizer adamw (this run's optimizer is sgd)");

  TrainConfig cosine;
  cosine.optim.gamma = 0.5;
  EXPECT_EQ(refusal(cosine), "--gamma applies to --schedule step (this run's schedule is cosine)");
  cosine.optim.schedule = "step";
  EXPECT_EQ(refusal(cosine), "");
  TrainConfig constant;
  constant.optim.schedule = "constant";
  constant.optim.min_lr = 0.001;
  EXPECT_EQ(refusal(constant), "--min-lr applies to --schedule cosine or WarmupCosineLR (this run's schedule is constant)");
  constant.optim.schedule = "cosine";
  EXPECT_EQ(refusal(constant), "");
}

TEST(SettingsInEffect, BucketSizesOnlyWhereThereAreSuchBuckets) {
  auto zero = under("zero2");
  zero.dist.bucket_cap_mb = 50;
  EXPECT_NE(refusal(zero).find("--bucket-cap-mb sizes ddp's gradient buckets (this run's strategy is zero2); use "
                               "--reduce-bucket-mb"),
            std::string::npos)
      << refusal(zero);
  auto ddp = under("ddp");
  ddp.sharding.reduce_bucket_mb = 50;
  EXPECT_NE(refusal(ddp).find("--reduce-bucket-mb"), std::string::npos);
  EXPECT_NE(refusal(ddp).find("--bucket-cap-mb"), std::string::npos);
  auto zero3 = under("zero3");
  zero3.sharding.reduce_bucket_mb = 50;
  EXPECT_NE(refusal(zero3).find("one unit at a time"), std::string::npos) << refusal(zero3);
  auto no_shard = under("fsdp");
  no_shard.sharding.fsdp_sharding = "no-shard";
  no_shard.sharding.reduce_bucket_mb = 50;
  EXPECT_EQ(refusal(no_shard), "");
  ddp.sharding.reduce_bucket_mb = 25;
  ddp.dist.bucket_cap_mb = 50;
  EXPECT_EQ(refusal(ddp), "");
  auto gather = under("zero1");
  gather.sharding.allgather_bucket_mb = 100;
  EXPECT_NE(refusal(gather).find("--allgather-bucket-mb"), std::string::npos);
}

TEST(SettingsInEffect, ReduceDtypeOverlapAndContiguousGradients) {
  auto single = under("single");
  single.sharding.reduce_dtype = "bf16";
  EXPECT_NE(refusal(single).find("--reduce-dtype: --strategy single reduces no gradients"), std::string::npos)
      << refusal(single);
  auto ddp = under("ddp");
  ddp.sharding.reduce_dtype = "bf16";
  ddp.sharding.overlap_comm = false;
  EXPECT_EQ(refusal(ddp), "");
  auto dp = under("dp");
  dp.sharding.overlap_comm = false;
  EXPECT_NE(refusal(dp).find("--no-overlap-comm"), std::string::npos);
  auto apart = under("zero2");
  apart.sharding.contiguous_gradients = false;
  EXPECT_NE(refusal(apart).find("--no-contiguous-gradients"), std::string::npos);
}

}  // namespace
