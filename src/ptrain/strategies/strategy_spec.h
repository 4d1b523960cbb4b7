// Which strategy a run uses, parsed once from --strategy (and --fsdp-sharding), and what it can do.
// Everything outside strategies/factory.cpp asks this type (does it shard the parameters? does it need
// a process group?) instead of comparing strategy names. It holds the one table of strategy names and
// the one table between ZeRO stages and strategies (DeepSpeed's zero_optimization.stage, accelerate's
// zero_stage). Adding a strategy: a row in the tables of strategy_spec.cpp and its answers below, and
// its case in factory.cpp.
//
// A small header with no LibTorch includes: config/ (which may not use strategies/) links it as the
// component ptrain_strategy_spec.
#pragma once

#include <string>
#include <vector>

namespace ptrain::strategies {

enum class StrategyKind { single, dp, ddp, zero1, zero2, zero3, fsdp };

// PyTorch FSDP's ShardingStrategy (strategies/fsdp.h describes each).
enum class FsdpSharding { full_shard, shard_grad_op, no_shard, hybrid_shard, hybrid_shard_zero2 };

class StrategySpec {
 public:
  StrategySpec() = default;  // single
  explicit StrategySpec(StrategyKind kind, FsdpSharding sharding = FsdpSharding::full_shard);

  // --strategy NAME, and for fsdp --fsdp-sharding NAME (ignored for the others). An unknown name throws
  // ptrain::Error naming the flag and the known names.
  static StrategySpec parse(const std::string& strategy, const std::string& fsdp_sharding = "full-shard");
  // A ZeRO stage as DeepSpeed and accelerate number them: 0 -> ddp, 1..3 -> zero1..zero3. `key` names
  // the file and key for the error when the stage is not 0..3.
  static StrategySpec from_zero_stage(long long stage, const std::string& key);

  // The names --strategy and --fsdp-sharding accept, in the order of the enums.
  static const std::vector<std::string>& names();
  static const std::vector<std::string>& fsdp_sharding_names();
  static std::string known_names();  // "single, dp, ddp, zero1, zero2, zero3, fsdp"
  static FsdpSharding parse_fsdp_sharding(const std::string& name);

  StrategyKind kind() const { return kind_; }
  FsdpSharding fsdp_sharding() const { return sharding_; }
  bool is(StrategyKind kind) const { return kind_ == kind; }
  std::string name() const;                // as --strategy spells it: "zero2", "fsdp"
  std::string fsdp_sharding_name() const;  // as --fsdp-sharding spells it: "shard-grad-op"
  std::string label() const;               // name(), with fsdp's sharding: "fsdp shard-grad-op"

  // One process a device, joined in a process group (launched by ptrain launch, torchrun, Slurm, MPI):
  // ddp, zero1-3, fsdp. single and dp run in one process.
  bool multi_process() const;
  // One process driving several devices, each with its replica of the model (PyTorch's DataParallel).
  bool drives_several_devices() const { return kind_ == StrategyKind::dp; }
  // ZeRO's stages, which take DeepSpeed's options (--offload-optimizer).
  bool is_zero() const;
  bool is_fsdp() const { return kind_ == StrategyKind::fsdp; }
  // Runs on the flat parameter groups of sharding.h (zero1-3 and every fsdp sharding).
  bool uses_flat_groups() const { return is_zero() || is_fsdp(); }

  // What one rank holds a 1/N share of between steps.
  bool shards_optimizer_state() const;
  bool shards_gradients() const;
  bool shards_parameters() const;
  // Parameters are gathered unit by unit around forward and backward: the model is cut into units
  // (models::Model::units()).
  bool needs_units() const { return shards_parameters(); }
  // A unit's gathered parameters are freed after its forward (and gathered again for its backward).
  bool reshards_after_forward() const;
  // Shards within groups of ranks, each group a replica of the others (fsdp hybrid-shard*).
  bool hybrid() const;
  // Gradients are reduced in groups of --reduce-bucket-mb (zero1, zero2, fsdp no-shard); ddp's buckets
  // take --bucket-cap-mb; the unit-by-unit strategies reduce one unit at a time.
  bool reduces_in_size_groups() const;
  // Can write a sharded checkpoint (--state-dict sharded): one file a rank and a manifest.
  bool saves_sharded() const { return uses_flat_groups(); }
  // The parameters can live on the CPU between uses (--offload-params).
  bool can_offload_params() const;
  // The optimizer state and step can live on the CPU (--offload-optimizer).
  bool can_offload_optimizer() const { return is_zero(); }
  // --reduce-dtype: gradients travel in a dtype of their own.
  bool takes_reduce_dtype() const { return kind_ == StrategyKind::ddp || is_fsdp(); }

  // The ZeRO stage that shards what this strategy shards between steps: 0 nothing (single, dp, ddp,
  // fsdp no-shard), 1 optimizer state, 2 and gradients, 3 and parameters (zero3, fsdp's other
  // shardings, whose parameters rest sharded).
  int zero_stage() const;

  bool operator==(const StrategySpec& other) const {
    return kind_ == other.kind_ && (kind_ != StrategyKind::fsdp || sharding_ == other.sharding_);
  }
  bool operator!=(const StrategySpec& other) const { return !(*this == other); }

 private:
  StrategyKind kind_ = StrategyKind::single;
  FsdpSharding sharding_ = FsdpSharding::full_shard;
};

}  // namespace ptrain::strategies
