// DeepSpeed's ZeRO stages, and PyTorch FSDP's shardings (fsdp.h), on the flat parameter groups of
// flat_param_group.h. Every rank runs the whole model on its part of the batch, as under DDP, but keeps
// only a 1/N share of the model state:
//   zero1  optimizer state sharded: gradients are all-reduced, each rank steps its shard (in fp32 masters
//          when the precision has them), the updated parameters are all-gathered;
//   zero2  and gradients: they are reduce-scattered, each rank keeps its shard of them only;
//   zero3  and parameters: a unit's parameters (models::Model::units(), or the whole model) are
//          all-gathered just before its forward and again before its backward, and freed after each.
// What the strategies differ in is the ShardingPolicy their StrategySpec answers; this engine only asks
// it. Parameters are grouped in flat buffers (replicated parameters: by dtype, at most
// --reduce-bucket-mb each, in the order backward produces gradients; sharded parameters: one per unit);
// a group's gradients are reduced as soon as backward has produced all of them. --offload-optimizer
// keeps the optimizer's shard and its update on the CPU, --offload-params (zero3) the parameter shards
// between uses. FSDP adds the options below the first block: its units, prefetching, hybrid groups and
// the gradient reduction dtype.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ptrain/distributed/process_group.h"
#include "ptrain/strategies/flat_param_group.h"
#include "ptrain/strategies/strategy.h"
#include "ptrain/strategy_spec/strategy_spec.h"

namespace ptrain::strategies {

// What the engine does besides what the strategy's StrategySpec says it shards.
struct ZeroOptions {
  bool offload_optimizer = false;
  bool offload_params = false;  // strategies that shard parameters only
  double reduce_bucket_mb = 25.0;  // replicated parameters: the size of a group; sharded ones group by unit
  // Reduce each group as soon as backward has produced all its gradients (false: every group in
  // finish_backward, after backward). Only the timing differs.
  bool overlap_comm = true;
  // Copy rank 0's buffers (BatchNorm running statistics) to every rank before each training forward (before
  // each evaluation and save they are copied whatever this says: Strategy::sync_buffers).
  bool broadcast_buffers = true;

  // Sharded parameters: which group each of models::Model::units() joins (consecutive units may share one); -1:
  // the root group, gathered for the whole forward. Empty: every unit its own group.
  std::function<std::vector<int>(models::Model&)> wrap;
  bool sync_module_states = true;     // copy rank 0's parameters and buffers in prepare()
  Prefetch backward_prefetch = Prefetch::none;  // gather the unit backward reaches next, early
  bool forward_prefetch = false;                // gather the next unit while this one runs forward
  std::optional<torch::ScalarType> reduce_dtype;  // gradients travel and sum in this dtype
  // Hybrid shardings: shard within consecutive groups of this many ranks, each group a replica of the
  // others; gradients are reduce-scattered in the group, then all-reduced across replicas. 0: one group.
  int64_t hybrid_group_size = 0;
};

class Zero final : public Strategy {
 public:
  // spec: zero1-3 or fsdp with its sharding.
  Zero(std::shared_ptr<distributed::ProcessGroup> group, torch::Device device, StrategySpec spec, ZeroOptions options);
  ~Zero() override;

  std::string name() const override { return spec_.name(); }
  int64_t rank() const override;
  int64_t world_size() const override;

  // Checks that every rank holds the same parameter shapes, copies rank 0's parameters and buffers,
  // lays the parameters out in flat groups, installs the gradient hooks; where parameters are sharded,
  // each group then frees all but this rank's shard.
  void prepare(models::Model& model) override;
  // Where parameters are sharded, gathers each unit's parameters around its forward, and arranges their
  // gathering again for its backward.
  torch::Tensor forward(models::Model& model, const torch::Tensor& inputs) override;
  void set_gradient_sync(bool enabled) override;
  // Reduces the gradients of groups that backward left incomplete (parameters without a gradient count
  // as zeros) and waits for every reduction.
  void finish_backward() override;
  torch::Tensor all_reduce_sum(torch::Tensor t) override;
  // Under fsdp too, whose training forwards leave the buffers alone as PyTorch's FSDP does.
  void sync_buffers() override;
  std::vector<std::string> all_gather_text(const std::string& name, const std::string& text) override;
  // Over NCCL the step's gathers, reductions and the found-inf and norm all-reduces are ordered on the device and
  // its groups are fixed at prepare(): the whole step can be recorded once and replayed, unless a part of it runs
  // on the host (an offloaded optimizer or parameter shards).
  std::string capture_obstacle() const override;
  // This rank's shards: the optimizer's tensors are one flat shard per group, named "zero.<group>".
  std::unique_ptr<UpdateTarget> update_target(models::Model& model, bool master_weights) override;
  // Groups whose gradient reduction has started in this synchronised step (before finish_backward: the
  // overlap with backward).
  size_t groups_reduced() const;
  // Of those, the ones whose collective has completed, asked without waiting (tests: reductions in flight).
  size_t reductions_completed() const;
  // How many flat groups (and so reductions) a step has.
  size_t group_count() const;
  // Groups holding gradient memory (a replicated group's flat gradients, a sharded one's reduced shard): from
  // the group's first gradient or reduction of a step to the end of its optimizer step (tests).
  size_t groups_holding_gradients() const;

  struct State;

 private:
  ZeroOptions options_;
  StrategySpec spec_;
  std::shared_ptr<State> state_;
};

}  // namespace ptrain::strategies
