#include <functional>

#include <gtest/gtest.h>

#include "ptrain/core/error.h"
#include "ptrain/strategy_spec/strategy_spec.h"

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

TEST(StrategySpec, OnlyDdpTakesBucketCapAndOnlyFsdpTakesFsdpsOptions) {
  for (const auto& spec : StrategySpec::all(FsdpSharding::no_shard)) {
    SCOPED_TRACE(spec.label());
    EXPECT_EQ(spec.reduces_in_ddp_buckets(), spec.name() == "ddp");
    EXPECT_EQ(spec.takes_fsdp_options(), spec.name() == "fsdp");
    EXPECT_EQ(spec.offloads_optimizer_with_params(), spec.name() == "fsdp");
  }
}

TEST(StrategySpec, AllListsEveryStrategyOnceInTheOrderOfItsNames) {
  const auto all = StrategySpec::all(FsdpSharding::shard_grad_op);
  ASSERT_EQ(all.size(), StrategySpec::names().size());
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i].name(), StrategySpec::names()[i]);
  EXPECT_EQ(all.back(), StrategySpec::parse("fsdp", "shard-grad-op"));
}

TEST(StrategyOptions, FlagNamesParseToTheirEnumsAndBack) {
  for (const auto& name : auto_wrap_names()) EXPECT_EQ(name_of(parse_auto_wrap(name)), name);
  for (const auto& name : backward_prefetch_names()) EXPECT_EQ(name_of(parse_backward_prefetch(name)), name);
  for (const auto& name : state_dict_names()) EXPECT_EQ(name_of(parse_state_dict(name)), name);
  EXPECT_EQ(parse_auto_wrap("type"), AutoWrap::type);
  EXPECT_EQ(parse_backward_prefetch("pre"), Prefetch::backward_pre);
  EXPECT_EQ(parse_backward_prefetch("post"), Prefetch::backward_post);
  EXPECT_EQ(parse_state_dict("sharded"), StateDict::sharded);
}

TEST(StrategyOptions, UnknownNamesNameTheFlagAndTheKnownOnes) {
  EXPECT_EQ(error_of([] { parse_auto_wrap("layer"); }), "--auto-wrap: unknown policy 'layer' (known: size, type, none)");
  EXPECT_EQ(error_of([] { parse_backward_prefetch("early"); }),
            "--backward-prefetch: unknown 'early' (known: none, pre, post)");
  EXPECT_EQ(error_of([] { parse_state_dict("local"); }), "--state-dict: unknown 'local' (known: full, sharded)");
}

// The descriptor rows: what ptrain estimate advises and what the bench's PyTorch reference runs.
TEST(StrategyDescriptor, EveryStrategyHasARowThatSaysWhatPyTorchRuns) {
  for (const auto& spec : StrategySpec::all()) {
    SCOPED_TRACE(spec.name());
    const auto& row = descriptor(spec);
    // A counterpart, or the reason there is none.
    EXPECT_NE(std::string(row.pytorch_strategy).empty(), std::string(row.pytorch_missing).empty());
    if (!std::string(row.pytorch_strategy).empty()) {
      EXPECT_NO_THROW(StrategySpec::parse(row.pytorch_strategy));
      // The reference wraps units exactly where it runs FSDP, which shards the parameters.
      EXPECT_EQ(row.pytorch_wraps_units, StrategySpec::parse(row.pytorch_strategy).shards_parameters());
    }
    EXPECT_FALSE(row.pytorch_compiles && row.pytorch_wraps_units);
    EXPECT_TRUE(std::string(row.advice_offloaded).empty() || row.estimate_offloaded);
  }
  EXPECT_EQ(std::string(descriptor(StrategySpec::parse("zero3")).pytorch_strategy), "fsdp");
  EXPECT_EQ(std::string(descriptor(StrategySpec::parse("zero1")).pytorch_class), "ZeroRedundancyOptimizer");
  EXPECT_NE(std::string(descriptor(StrategySpec::parse("zero2")).pytorch_missing).find("ZeRO-2"), std::string::npos);
  // ptrain estimate's ladder: single, ddp, zero2, zero3, then zero3 with the optimizer state offloaded.
  std::vector<std::string> advised;
  for (const auto& spec : StrategySpec::all())
    if (*descriptor(spec).advice) advised.push_back(spec.name());
  for (const auto& spec : StrategySpec::all())
    if (*descriptor(spec).advice_offloaded) advised.push_back(spec.name() + "+offload");
  EXPECT_EQ(advised, (std::vector<std::string>{"single", "ddp", "zero2", "zero3", "zero3+offload"}));
}

}  // namespace
}  // namespace ptrain::strategies
