#include "ptrain/strategy_spec/strategy_spec.h"

#include <array>

#include "ptrain/core/error.h"

namespace ptrain::strategies {
namespace {

// The one table of strategies, in the order of StrategyKind: the name --strategy takes and the
// descriptor row (strategy_spec.h says what each field means).
struct StrategyRow {
  const char* name;
  StrategyDescriptor descriptor;
};

const std::vector<StrategyRow>& strategy_table() {
  static const std::vector<StrategyRow> rows{
      {"single",
       {false, "Fits on {where} ({total}).", "", "single", "", "", false, false, true}},
      {"dp", {false, "", "", "dp", "", "DataParallel", false, false, false}},
      {"ddp",
       {false, "ddp fits ({total} per device).", "", "ddp", "", "DistributedDataParallel", false, false, true}},
      {"zero1", {false, "", "", "zero1", "", "ZeroRedundancyOptimizer", false, false, true}},
      {"zero2",
       {false, "Model states do not fit replicated: shard them with zero2 over {n} devices ({total} each).", "", "",
        "PyTorch has no ZeRO-2 of its own (FSDP's shard-grad-op, the nearest, is not in the reference)", "", false,
        false, false}},
      {"zero3",
       {true, "Shard the parameters too: zero3 (or fsdp full-shard) over {n} devices ({total} each).",
        "Even zero3 does not fit: offload the optimizer state to the CPU (zero3 --offload-optimizer, {total} per "
        "device).",
        "fsdp", "", "FSDP", true, true, false}},
      {"fsdp", {false, "", "", "fsdp", "", "FSDP", true, true, false}},
  };
  return rows;
}

const std::vector<std::string>& strategy_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& row : strategy_table()) out.emplace_back(row.name);
    return out;
  }();
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

// The enum of position i in `names`, or an error naming the flag and the known names.
template <typename Enum>
Enum parse_named(const std::vector<std::string>& names, const std::string& name, const std::string& what) {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<Enum>(i);
  throw Error(what + " '" + name + "' (known: " + joined(names) + ")");
}

}  // namespace

const std::vector<std::string>& auto_wrap_names() {
  static const std::vector<std::string> names{"size", "type", "none"};
  return names;
}
const std::vector<std::string>& backward_prefetch_names() {
  static const std::vector<std::string> names{"none", "pre", "post"};
  return names;
}
const std::vector<std::string>& state_dict_names() {
  static const std::vector<std::string> names{"full", "sharded"};
  return names;
}

AutoWrap parse_auto_wrap(const std::string& name) {
  return parse_named<AutoWrap>(auto_wrap_names(), name, "--auto-wrap: unknown policy");
}
Prefetch parse_backward_prefetch(const std::string& name) {
  return parse_named<Prefetch>(backward_prefetch_names(), name, "--backward-prefetch: unknown");
}
StateDict parse_state_dict(const std::string& name) {
  return parse_named<StateDict>(state_dict_names(), name, "--state-dict: unknown");
}

std::string name_of(AutoWrap policy) { return auto_wrap_names().at(static_cast<size_t>(policy)); }
std::string name_of(Prefetch prefetch) { return backward_prefetch_names().at(static_cast<size_t>(prefetch)); }
std::string name_of(StateDict kind) { return state_dict_names().at(static_cast<size_t>(kind)); }

const StrategyDescriptor& descriptor(const StrategySpec& spec) {
  return strategy_table().at(static_cast<size_t>(spec.kind())).descriptor;
}

std::vector<StrategySpec> StrategySpec::all(FsdpSharding fsdp_sharding) {
  std::vector<StrategySpec> specs;
  for (size_t i = 0; i < strategy_table().size(); ++i) specs.emplace_back(static_cast<StrategyKind>(i), fsdp_sharding);
  return specs;
}

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
