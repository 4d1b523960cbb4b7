#include "ptrain/strategies/strategy_spec.h"

#include <array>

#include "ptrain/core/error.h"

namespace ptrain::strategies {
namespace {

// The one table of strategy names, in the order of StrategyKind.
const std::vector<std::string>& strategy_names() {
  static const std::vector<std::string> names{"single", "dp", "ddp", "zero1", "zero2", "zero3", "fsdp"};
  return names;
}

// The one table between ZeRO stages (DeepSpeed's zero_optimization.stage, accelerate's zero_stage) and
// strategies: stage 0 shards nothing, which is ddp.
constexpr std::array<StrategyKind, 4> kByZeroStage{StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2,
                                                   StrategyKind::zero3};

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

StrategySpec::StrategySpec(StrategyKind kind, FsdpSharding sharding) : kind_(kind), sharding_(sharding) {}

const std::vector<std::string>& StrategySpec::names() { return strategy_names(); }

const std::vector<std::string>& StrategySpec::fsdp_sharding_names() {
  static const std::vector<std::string> names{"full-shard", "shard-grad-op", "no-shard", "hybrid-shard",
                                              "hybrid-shard-zero2"};
  return names;
}

std::string StrategySpec::known_names() { return joined(names()); }

FsdpSharding StrategySpec::parse_fsdp_sharding(const std::string& name) {
  const auto& known = fsdp_sharding_names();
  for (size_t i = 0; i < known.size(); ++i)
    if (known[i] == name) return static_cast<FsdpSharding>(i);
  throw Error("--fsdp-sharding: unknown strategy '" + name + "' (known: " + joined(known) + ")");
}

StrategySpec StrategySpec::parse(const std::string& strategy, const std::string& fsdp_sharding) {
  const auto& known = names();
  for (size_t i = 0; i < known.size(); ++i) {
    if (known[i] != strategy) continue;
    const auto kind = static_cast<StrategyKind>(i);
    return kind == StrategyKind::fsdp ? StrategySpec(kind, parse_fsdp_sharding(fsdp_sharding)) : StrategySpec(kind);
  }
  throw Error("--strategy: unknown strategy '" + strategy + "' (known: " + known_names() + ")");
}

StrategySpec StrategySpec::from_zero_stage(long long stage, const std::string& key) {
  check(stage >= 0 && stage < static_cast<long long>(kByZeroStage.size()), key + " must be 0, 1, 2 or 3");
  return StrategySpec(kByZeroStage[static_cast<size_t>(stage)]);
}

std::string StrategySpec::name() const { return strategy_names().at(static_cast<size_t>(kind_)); }

std::string StrategySpec::fsdp_sharding_name() const {
  return fsdp_sharding_names().at(static_cast<size_t>(sharding_));
}

std::string StrategySpec::label() const { return is_fsdp() ? name() + " " + fsdp_sharding_name() : name(); }

bool StrategySpec::multi_process() const { return kind_ != StrategyKind::single && kind_ != StrategyKind::dp; }

bool StrategySpec::is_zero() const {
  return kind_ == StrategyKind::zero1 || kind_ == StrategyKind::zero2 || kind_ == StrategyKind::zero3;
}

int StrategySpec::zero_stage() const {
  switch (kind_) {
    case StrategyKind::zero1: return 1;
    case StrategyKind::zero2: return 2;
    case StrategyKind::zero3: return 3;
    case StrategyKind::fsdp: return sharding_ == FsdpSharding::no_shard ? 0 : 3;
    case StrategyKind::single:
    case StrategyKind::dp:
    case StrategyKind::ddp: return 0;
  }
  return 0;
}

bool StrategySpec::shards_optimizer_state() const { return zero_stage() >= 1; }
bool StrategySpec::shards_gradients() const { return zero_stage() >= 2; }
bool StrategySpec::shards_parameters() const { return zero_stage() >= 3; }

bool StrategySpec::reshards_after_forward() const {
  if (kind_ == StrategyKind::zero3) return true;
  return is_fsdp() && (sharding_ == FsdpSharding::full_shard || sharding_ == FsdpSharding::hybrid_shard);
}

bool StrategySpec::hybrid() const {
  return is_fsdp() && (sharding_ == FsdpSharding::hybrid_shard || sharding_ == FsdpSharding::hybrid_shard_zero2);
}

bool StrategySpec::reduces_in_size_groups() const {
  return kind_ == StrategyKind::zero1 || kind_ == StrategyKind::zero2 ||
         (is_fsdp() && sharding_ == FsdpSharding::no_shard);
}

bool StrategySpec::can_offload_params() const { return shards_parameters(); }

}  // namespace ptrain::strategies
