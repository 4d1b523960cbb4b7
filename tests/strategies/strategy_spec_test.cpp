#include <functional>

#include <gtest/gtest.h>

#include "ptrain/core/error.h"
#include "ptrain/strategies/strategy_spec.h"

namespace ptrain::strategies {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(StrategySpec, EveryNameParsesToItselfAndBack) {
  ASSERT_EQ(StrategySpec::names().size(), 7u);
  for (const auto& name : StrategySpec::names()) EXPECT_EQ(StrategySpec::parse(name).name(), name);
  for (const auto& sharding : StrategySpec::fsdp_sharding_names()) {
    const auto spec = StrategySpec::parse("fsdp", sharding);
    EXPECT_EQ(spec.fsdp_sharding_name(), sharding);
    EXPECT_EQ(spec.label(), "fsdp " + sharding);
  }
  EXPECT_EQ(StrategySpec().name(), "single");
  EXPECT_EQ(StrategySpec::parse("zero2", "no-such-sharding").name(), "zero2");  // only fsdp reads it
}

TEST(StrategySpec, UnknownNamesNameTheFlagAndTheKnownOnes) {
  EXPECT_EQ(error_of([] { StrategySpec::parse("zero4"); }),
            "--strategy: unknown strategy 'zero4' (known: single, dp, ddp, zero1, zero2, zero3, fsdp)");
  EXPECT_EQ(error_of([] { StrategySpec::parse("fsdp", "half-shard"); }),
            "--fsdp-sharding: unknown strategy 'half-shard' (known: full-shard, shard-grad-op, no-shard, "
            "hybrid-shard, hybrid-shard-zero2)");
}

TEST(StrategySpec, ZeroStagesMapBothWays) {
  EXPECT_EQ(StrategySpec::from_zero_stage(0, "k").kind(), StrategyKind::ddp);
  for (int stage = 1; stage <= 3; ++stage) {
    const auto spec = StrategySpec::from_zero_stage(stage, "k");
    EXPECT_EQ(spec.name(), "zero" + std::to_string(stage));
    EXPECT_EQ(spec.zero_stage(), stage);
    EXPECT_TRUE(spec.is_zero());
  }
  EXPECT_EQ(error_of([] { StrategySpec::from_zero_stage(4, "ds.json: zero_optimization.stage"); }),
            "ds.json: zero_optimization.stage must be 0, 1, 2 or 3");
  EXPECT_NE(error_of([] { StrategySpec::from_zero_stage(-1, "k"); }), "");
}

TEST(StrategySpec, CapabilitiesFollowWhatEachStrategyShards) {
  struct Row {
    StrategySpec spec;
    bool multi, optimizer, grads, params, reshard, units, sharded_save, size_groups;
  };
  const std::vector<Row> rows{
      {StrategySpec::parse("single"), false, false, false, false, false, false, false, false},
      {StrategySpec::parse("dp"), false, false, false, false, false, false, false, false},
      {StrategySpec::parse("ddp"), true, false, false, false, false, false, false, false},
      {StrategySpec::parse("zero1"), true, true, false, false, false, false, true, true},
      {StrategySpec::parse("zero2"), true, true, true, false, false, false, true, true},
      {StrategySpec::parse("zero3"), true, true, true, true, true, true, true, false},
      {StrategySpec::parse("fsdp", "full-shard"), true, true, true, true, true, true, true, false},
      {StrategySpec::parse("fsdp", "shard-grad-op"), true, true, true, true, false, true, true, false},
      {StrategySpec::parse("fsdp", "no-shard"), true, false, false, false, false, false, true, true},
      {StrategySpec::parse("fsdp", "hybrid-shard"), true, true, true, true, true, true, true, false},
      {StrategySpec::parse("fsdp", "hybrid-shard-zero2"), true, true, true, true, false, true, true, false},
  };
  for (const auto& r : rows) {
    SCOPED_TRACE(r.spec.label());
    EXPECT_EQ(r.spec.multi_process(), r.multi);
    EXPECT_EQ(r.spec.shards_optimizer_state(), r.optimizer);
    EXPECT_EQ(r.spec.shards_gradients(), r.grads);
    EXPECT_EQ(r.spec.shards_parameters(), r.params);
    EXPECT_EQ(r.spec.reshards_after_forward(), r.reshard);
    EXPECT_EQ(r.spec.needs_units(), r.units);
    EXPECT_EQ(r.spec.saves_sharded(), r.sharded_save);
    EXPECT_EQ(r.spec.reduces_in_size_groups(), r.size_groups);
    EXPECT_EQ(r.spec.hybrid(), r.spec.label().find("hybrid") != std::string::npos);
  }
  EXPECT_TRUE(StrategySpec::parse("dp").drives_several_devices());
  EXPECT_TRUE(StrategySpec::parse("zero1").can_offload_optimizer());
  EXPECT_FALSE(StrategySpec::parse("fsdp").can_offload_optimizer());
  EXPECT_TRUE(StrategySpec::parse("fsdp").can_offload_params());
  EXPECT_FALSE(StrategySpec::parse("zero2").can_offload_params());
  EXPECT_EQ(StrategySpec::parse("fsdp", "no-shard"), StrategySpec::parse("fsdp", "no-shard"));
  EXPECT_NE(StrategySpec::parse("fsdp", "no-shard"), StrategySpec::parse("fsdp"));
}

}  // namespace
}  // namespace ptrain::strategies
