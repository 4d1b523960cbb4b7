#include "ptrain/strategies/fsdp.h"

#include <algorithm>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#include "ptrain/core/error.h"
#include "ptrain/core/text.h"
#include "ptrain/models/model_summary.h"
#include "ptrain/strategy_spec/strategy_spec.h"

namespace ptrain::strategies {
namespace {

int64_t parameter_count(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

// "ptrain::models::(anonymous namespace)::Bottleneck" -> "Bottleneck"; LibTorch's holder classes end
// in Impl ("LinearImpl" -> "Linear").
std::string type_of(const torch::nn::Module& module) {
  std::string name = module.name();
  const auto colon = name.rfind("::");
  if (colon != std::string::npos) name = name.substr(colon + 2);
  remove_suffix(name, "Impl");
  return name;
}

// "layer2.3" -> "layer2"; top-level blocks have no parent.
std::string parent_of(const std::string& unit_name) {
  const auto dot = unit_name.rfind('.');
  return dot == std::string::npos ? "" : unit_name.substr(0, dot);
}

using models::with_commas;

}  // namespace

std::vector<int> fsdp_auto_wrap(models::Model& model, const FsdpOptions& options) {
  const auto units = model.units();
  std::vector<int> wrap(units.size(), -1);
  int next = 0;
  if (options.auto_wrap == AutoWrap::none) return wrap;
  if (options.auto_wrap == AutoWrap::type) {
    std::set<std::string> seen;
    for (size_t u = 0; u < units.size(); ++u) {
      const std::string type = type_of(*units[u].second);
      seen.insert(type);
      if (std::find(options.wrap_types.begin(), options.wrap_types.end(), type) != options.wrap_types.end()) wrap[u] = next++;
    }
    if (next == 0) {
      std::string wanted, known;
      for (const auto& t : options.wrap_types) wanted += (wanted.empty() ? "" : ", ") + t;
      for (const auto& t : seen) known += (known.empty() ? "" : ", ") + t;
      throw Error("--wrap-types " + wanted + ": no block of " + model.name() + " has such a type (its blocks: " + known + ")");
    }
    return wrap;
  }
  std::vector<int64_t> counts;
  for (const auto& [name, module] : units) counts.push_back(parameter_count(*module));
  // As PyTorch's size-based policy, innermost first: a block that alone holds enough is a unit; then
  // the blocks a parent still holds unwrapped become one unit when together they hold enough.
  for (size_t u = 0; u < units.size(); ++u) {
    if (counts[u] >= options.min_num_params) wrap[u] = next++;
  }
  for (size_t u = 0; u < units.size();) {
    const std::string parent = parent_of(units[u].first);
    if (wrap[u] >= 0 || parent.empty()) {
      ++u;
      continue;
    }
    size_t end = u;
    int64_t total = 0;
    while (end < units.size() && wrap[end] < 0 && parent_of(units[end].first) == parent) total += counts[end++];
    if (total >= options.min_num_params) {
      for (size_t k = u; k < end; ++k) wrap[k] = next;
      ++next;
    }
    u = end;
  }
  // Units numbered in forward order.
  std::map<int, int> renumbered;
  for (auto& id : wrap) {
    if (id < 0) continue;
    if (!renumbered.count(id)) {
      const int next_id = static_cast<int>(renumbered.size());
      renumbered[id] = next_id;
    }
    id = renumbered[id];
  }
  return wrap;
}

std::string describe_units(models::Model& model, const std::vector<int>& wrap, int64_t shard_ranks, bool sharded) {
  const auto units = model.units();
  check(wrap.size() == units.size(), "describe_units: one entry a block is needed");
  std::map<int, int64_t> unit_params;
  int64_t in_blocks = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t n = parameter_count(*units[u].second);
    unit_params[wrap[u]] += n;
    in_blocks += n;
  }
  unit_params[-1] += parameter_count(model) - in_blocks;  // parameters outside every block belong to the root
  const auto shard_of = [&](int64_t n) { return sharded ? (n + shard_ranks - 1) / shard_ranks : n; };
  std::ostringstream out;
  for (size_t u = 0; u < units.size(); ++u) {
    out << "  " << std::left << std::setw(12) << units[u].first << std::setw(12) << type_of(*units[u].second)
        << std::right << std::setw(14) << with_commas(parameter_count(*units[u].second)) << " params  "
        << (wrap[u] < 0 ? std::string("root") : "unit " + std::to_string(wrap[u])) << "\n";
  }
  for (const auto& [id, n] : unit_params) {
    if (id < 0 && n == 0) continue;
    out << "  " << (id < 0 ? std::string("root") : "unit " + std::to_string(id)) << ": " << with_commas(n)
        << " params, " << with_commas(shard_of(n)) << " per rank\n";
  }
  return out.str();
}

std::string describe_fsdp_units(models::Model& model, const FsdpOptions& options, int64_t shard_ranks) {
  const auto wrap = fsdp_auto_wrap(model, options);
  std::set<int> units(wrap.begin(), wrap.end());
  const StrategySpec spec(StrategyKind::fsdp, options.sharding);
  const bool sharded = spec.shards_parameters();
  std::ostringstream out;
  out << spec.label() << ", auto-wrap " << name_of(options.auto_wrap);
  if (options.auto_wrap == AutoWrap::size) out << " (min_num_params " << with_commas(options.min_num_params) << ")";
  if (options.auto_wrap == AutoWrap::type) {
    out << " (";
    for (size_t i = 0; i < options.wrap_types.size(); ++i) out << (i ? ", " : "") << options.wrap_types[i];
    out << ")";
  }
  out << ": " << units.size() - units.count(-1) << " units and the root, "
      << (sharded ? "each sharded over " + std::to_string(shard_ranks) + (shard_ranks == 1 ? " rank" : " ranks")
               : "replicated on every rank") << "\n";
  return out.str() + describe_units(model, wrap, shard_ranks, sharded);
}

FsdpOptions fsdp_options(const StrategySpec& spec, const StrategyOptions& options) {
  FsdpOptions o;
  o.sharding = spec.fsdp_sharding();
  o.auto_wrap = options.auto_wrap;
  o.min_num_params = options.min_num_params;
  o.wrap_types = options.wrap_types;
  o.backward_prefetch = options.backward_prefetch;
  o.forward_prefetch = options.forward_prefetch;
  o.offload_params = options.offload_params;
  o.sync_module_states = options.sync_module_states;
  o.hybrid_group_size = options.hybrid_group_size;
  o.bucket_mb = options.reduce_bucket_mb;
  o.overlap_comm = options.overlap_comm;
  return o;
}

ZeroOptions fsdp_engine_options(const FsdpOptions& options, int64_t local_world_size) {
  ZeroOptions z;
  if (StrategySpec(StrategyKind::fsdp, options.sharding).hybrid())
    z.hybrid_group_size = options.hybrid_group_size > 0 ? options.hybrid_group_size : local_world_size;
  z.offload_params = options.offload_params;
  z.offload_optimizer = options.offload_params;  // FSDP's CPU offload steps the optimizer on the CPU too
  const auto wrap = options;
  z.wrap = [wrap](models::Model& model) { return fsdp_auto_wrap(model, wrap); };
  z.backward_prefetch = options.backward_prefetch;
  z.forward_prefetch = options.forward_prefetch;
  z.sync_module_states = options.sync_module_states;
  z.reduce_dtype = options.reduce_dtype;
  z.reduce_bucket_mb = options.bucket_mb;
  z.overlap_comm = options.overlap_comm;
  z.broadcast_buffers = false;  // FSDP leaves buffers alone after sync_module_states
  return z;
}

std::unique_ptr<Strategy> make_fsdp(std::shared_ptr<distributed::ProcessGroup> group, torch::Device device,
                                    const FsdpOptions& options, int64_t local_world_size) {
  return std::make_unique<Zero>(std::move(group), device, StrategySpec(StrategyKind::fsdp, options.sharding),
                                fsdp_engine_options(options, local_world_size));
}

}  // namespace ptrain::strategies
