// PyTorch FSDP's behaviour, on the sharding machinery of the ZeRO stages (zero.h): the model is cut
// into units by an auto-wrap policy, and each unit's parameters are one flat buffer sharded over the
// ranks (or, for NO_SHARD, replicated). Sharding strategies, in ZeRO's words:
//   full-shard          parameters, gradients and optimizer state sharded; a unit's parameters are
//                       gathered before its forward and again before its backward, freed after each
//   shard-grad-op       gradients and optimizer state sharded; gathered parameters stay from a unit's
//                       forward until its backward is over
//   no-shard            nothing sharded; gradients all-reduced per bucket (DDP's arithmetic)
//   hybrid-shard        full-shard within groups of ranks (by default the ranks of one node), each group
//                       a replica: gradients reduce-scattered in the group, then all-reduced across groups
//   hybrid-shard-zero2  the same with shard-grad-op
// Units are the model's blocks (models::Model::units()) or runs of neighbouring blocks of one parent:
// FSDP's policies wrap modules, and a block is the smallest module whose forward ptrain can surround.
// Parameters outside every wrapped unit form the root unit, gathered from forward to the end of backward.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ptrain/distributed/process_group.h"
#include "ptrain/models/model.h"
#include "ptrain/strategies/strategy.h"
#include "ptrain/strategies/zero.h"

namespace ptrain::strategies {

struct FsdpOptions {
  FsdpSharding sharding = FsdpSharding::full_shard;  // see above
  AutoWrap auto_wrap = AutoWrap::size;
  int64_t min_num_params = 100000000;   // size: a unit holds at least this many parameters
  std::vector<std::string> wrap_types;  // type: class names of blocks (e.g. Bottleneck, BasicBlock)
  Prefetch backward_prefetch = Prefetch::backward_pre;
  bool forward_prefetch = false;
  bool offload_params = false;          // shards, their gradients and the optimizer step on the CPU
  bool sync_module_states = true;
  std::optional<torch::ScalarType> reduce_dtype;
  int64_t hybrid_group_size = 0;        // hybrid-*: ranks sharing one copy; 0: the local world size
  double bucket_mb = 25;                // no-shard: gradient all-reduce buckets
  bool overlap_comm = true;             // reduce a unit's gradients as soon as backward has produced them
};

// fsdp's options as the plan resolved them (--fsdp-sharding in spec, --auto-wrap and the other FSDP
// flags in options; accelerate's fsdp_config lands there too). reduce_dtype is the factory's, from the
// precision policy.
FsdpOptions fsdp_options(const StrategySpec& spec, const StrategyOptions& options);

// The unit each of model.units() joins under the policy: an index shared by neighbouring blocks of one
// unit, or -1 for the root.
std::vector<int> fsdp_auto_wrap(models::Model& model, const FsdpOptions& options);

// The model's blocks with the unit each joins (wrap, as fsdp_auto_wrap answers) and the parameters it
// holds, one line a block, then each unit's parameters and per-rank shard: what --dry-run prints for
// fsdp and zero3.
std::string describe_units(models::Model& model, const std::vector<int>& wrap, int64_t shard_ranks, bool sharded);
// The same under FSDP's policy, headed by the policy.
std::string describe_fsdp_units(models::Model& model, const FsdpOptions& options, int64_t shard_ranks);

// The ZeRO machinery's options that behave as FSDP with these options (the sharding is the engine's
// StrategySpec: fsdp with options.sharding). local_world_size: ranks per node.
ZeroOptions fsdp_engine_options(const FsdpOptions& options, int64_t local_world_size);

std::unique_ptr<Strategy> make_fsdp(std::shared_ptr<distributed::ProcessGroup> group, torch::Device device,
                                    const FsdpOptions& options, int64_t local_world_size);

}  // namespace ptrain::strategies
