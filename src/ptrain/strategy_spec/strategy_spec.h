// Which strategy a run uses, parsed once from --strategy (and --fsdp-sharding), and what it can do.
// Everything outside strategies/ asks this type (does it shard the parameters? does it need a process
// group?) or its descriptor row (what ptrain estimate compares it with, its PyTorch counterpart) instead
// of comparing strategy names. It holds the one table of strategies (strategy_spec.cpp: name and
// descriptor row) and the one table between ZeRO stages and strategies (DeepSpeed's
// zero_optimization.stage, accelerate's zero_stage). Adding a strategy: see docs/architecture.md.
//
// A component of its own (strategy_spec/, no LibTorch includes), below config/, which may not use strategies/
// but reads --strategy into this type; its namespace is the strategies' it names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ptrain::strategies {

enum class StrategyKind { single, dp, ddp, zero1, zero2, zero3, fsdp };

// PyTorch FSDP's ShardingStrategy (strategies/fsdp.h describes each).
enum class FsdpSharding { full_shard, shard_grad_op, no_shard, hybrid_shard, hybrid_shard_zero2 };

// How FSDP cuts the model into units (--auto-wrap): by parameter count (--min-num-params), by block
// class (--wrap-types), or not at all (the root unit only).
enum class AutoWrap { size, type, none };
// Which unit's parameters backward gathers early (--backward-prefetch, PyTorch's BackwardPrefetch):
// none, the next unit's before the current one's gradient computation (pre), or after it (post).
enum class Prefetch { none, backward_pre, backward_post };
// What a checkpoint of a sharded strategy holds (--state-dict): everything gathered on rank 0, or one
// file of shards a rank and a manifest.
enum class StateDict { full, sharded };

// The strategy's settings, parsed and checked once by the plan (train::make_plan) from the config:
// strategies and the factory read these, never the config's names.
struct StrategyOptions {
  // The process group (one process a device): --backend ("" the device's: nccl or gloo), --timeout.
  std::string backend;
  double timeout_seconds = 300;
  int64_t replicas = 0;          // dp: devices driven by one process
  double bucket_cap_mb = 25;     // ddp's gradient buckets
  bool sync_batchnorm = false;   // ddp
  bool overlap_comm = true;      // reduce gradients while backward still runs
  double reduce_bucket_mb = 25;  // zero1, zero2, fsdp no-shard: the size of a gradient group
  bool offload_optimizer = false;
  bool offload_params = false;
  StateDict state_dict = StateDict::full;
  // FSDP's own.
  AutoWrap auto_wrap = AutoWrap::size;
  int64_t min_num_params = 100000000;
  std::vector<std::string> wrap_types;
  Prefetch backward_prefetch = Prefetch::backward_pre;
  bool forward_prefetch = false;
  bool sync_module_states = true;
  int64_t hybrid_group_size = 0;  // hybrid-*: ranks sharing one copy; 0: the local world size
};

// The names --auto-wrap, --backward-prefetch and --state-dict accept, in the order of the enums, and
// their parsers: an unknown name throws ptrain::Error naming the flag and the known names.
const std::vector<std::string>& auto_wrap_names();
const std::vector<std::string>& backward_prefetch_names();
const std::vector<std::string>& state_dict_names();
AutoWrap parse_auto_wrap(const std::string& name);
Prefetch parse_backward_prefetch(const std::string& name);
StateDict parse_state_dict(const std::string& name);
std::string name_of(AutoWrap policy);
std::string name_of(Prefetch prefetch);
std::string name_of(StateDict kind);

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
  // DDP's gradient buckets, sized by --bucket-cap-mb.
  bool reduces_in_ddp_buckets() const { return kind_ == StrategyKind::ddp; }
  // FSDP's options: --fsdp-sharding, the auto-wrap policy that cuts the model into units, prefetching,
  // FSDP's MixedPrecision (--param-dtype, --buffer-dtype), --hybrid-group-size, --no-sync-module-states.
  bool takes_fsdp_options() const { return is_fsdp(); }
  // --offload-params moves the optimizer state and its step to the CPU too (FSDP's CPU offload).
  bool offloads_optimizer_with_params() const { return is_fsdp(); }

  // The ZeRO stage that shards what this strategy shards between steps: 0 nothing (single, dp, ddp,
  // fsdp no-shard), 1 optimizer state, 2 and gradients, 3 and parameters (zero3, fsdp's other
  // shardings, whose parameters rest sharded).
  int zero_stage() const;

  // Every strategy, in the order of StrategyKind (fsdp with `fsdp_sharding`).
  static std::vector<StrategySpec> all(FsdpSharding fsdp_sharding = FsdpSharding::full_shard);

  bool operator==(const StrategySpec& other) const {
    return kind_ == other.kind_ && (kind_ != StrategyKind::fsdp || sharding_ == other.sharding_);
  }
  bool operator!=(const StrategySpec& other) const { return !(*this == other); }

 private:
  StrategyKind kind_ = StrategyKind::single;
  FsdpSharding sharding_ = FsdpSharding::full_shard;
};

// One row per strategy, beside its name in strategy_spec.cpp: what the tools around the trainer
// (ptrain estimate, the bench's PyTorch reference) need to know of it, so that none of them keeps a list
// of strategies of its own.
struct StrategyDescriptor {
  // ptrain estimate: whether its table has a row for this strategy with the optimizer state offloaded as
  // well, and the advice it gives when this is the first row that fits (rows in table order, offloaded
  // rows after the others; "" never advised). In the advice {where} is the device ("one GPU", "the
  // host"), {n} the device count, {total} the row's memory per device.
  bool estimate_offloaded = false;
  const char* advice = "";
  const char* advice_offloaded = "";
  // The bench's PyTorch reference (bench/pytorch_reference.py): the --strategy it trains this strategy
  // with, "" where PyTorch has no counterpart (missing says why); the PyTorch class that does it;
  // whether it needs CUDA, wraps the model into units (and so takes --fsdp-min-params, and cannot wrap
  // a TorchScript module), and can be compiled (torch.compile).
  const char* pytorch_strategy = "";
  const char* pytorch_missing = "";
  const char* pytorch_class = "";
  bool pytorch_needs_cuda = false;
  bool pytorch_wraps_units = false;
  bool pytorch_compiles = false;
};

const StrategyDescriptor& descriptor(const StrategySpec& spec);

}  // namespace ptrain::strategies
