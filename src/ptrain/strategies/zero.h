// DeepSpeed's ZeRO stages on the flat shards of sharding.h. Every rank runs the whole model on its part
// of the batch, as under DDP, but keeps only a 1/N share of the model state:
//   zero1  optimizer state sharded: gradients are all-reduced, each rank steps its shard (in fp32 masters
//          when the precision has them), the updated parameters are all-gathered;
//   zero2  and gradients: they are reduce-scattered, each rank keeps its shard of them only;
//   zero3  and parameters: a unit's parameters (models::Model::units(), or the whole model) are
//          all-gathered just before its forward and again before its backward, and freed after each.
// Parameters are grouped in flat buffers (stages 1 and 2: by dtype, at most --reduce-bucket-mb each, in
// the order backward produces gradients; stage 3: one per unit); a group's gradients are reduced as
// soon as backward has produced all of them. --offload-optimizer keeps the optimizer's shard and its
// update on the CPU, --offload-params (stage 3) the parameter shards between uses.
// FSDP (fsdp.h) runs on this same machinery with the options below its first block: its units, a
// stage 0 for NO_SHARD, gathered parameters kept from forward to backward for SHARD_GRAD_OP, shards
// within groups of ranks for HYBRID_SHARD, prefetching and the gradient reduction dtype.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ptrain/dist/process_group.h"
#include "ptrain/strategies/strategy.h"

namespace ptrain::strategies {

enum class Prefetch { none, backward_pre, backward_post };

struct ZeroOptions {
  int stage = 1;                // 0: nothing sharded, gradients all-reduced per group (FSDP's NO_SHARD)
  bool offload_optimizer = false;
  bool offload_params = false;  // stage 3 only
  double reduce_bucket_mb = 25.0;  // stages 0-2: the size of a group; stage 3's groups are its units
  // Reduce each group as soon as backward has produced all its gradients (false: every group in
  // finish_backward, after backward). Only the timing differs.
  bool overlap_comm = true;
  // Copy rank 0's buffers (BatchNorm running statistics) to every rank before each training forward.
  bool broadcast_buffers = true;

  std::string name;             // empty: "zero<stage>"
  // Stage 3: which group each of models::Model::units() joins (consecutive units may share one); -1:
  // the root group, gathered for the whole forward. Empty: every unit its own group.
  std::function<std::vector<int>(models::Model&)> wrap;
  bool reshard_after_forward = true;  // stage 3; false: a unit's parameters stay gathered until its backward
  bool sync_module_states = true;     // copy rank 0's parameters and buffers in prepare()
  Prefetch backward_prefetch = Prefetch::none;  // stage 3: gather the unit backward reaches next, early
  bool forward_prefetch = false;                // stage 3: gather the next unit while this one runs forward
  std::optional<torch::ScalarType> reduce_dtype;  // gradients travel and sum in this dtype
  // Stage 3: shard within consecutive groups of this many ranks, each group a replica of the others;
  // gradients are reduce-scattered in the group, then all-reduced across replicas. 0: one group.
  int64_t shard_group_size = 0;
};

class Zero final : public Strategy {
 public:
  Zero(std::shared_ptr<dist::ProcessGroup> group, torch::Device device, ZeroOptions options);
  ~Zero() override;

  std::string name() const override {
    return options_.name.empty() ? "zero" + std::to_string(options_.stage) : options_.name;
  }
  int64_t rank() const override;
  int64_t world_size() const override;

  // Checks that every rank holds the same parameter shapes, copies rank 0's parameters and buffers,
  // lays the parameters out in flat groups, installs the gradient hooks; stage 3 then frees all but
  // this rank's shard.
  void prepare(models::Model& model) override;
  // Stage 3 gathers each unit's parameters around its forward, and arranges their gathering again for
  // its backward.
  torch::Tensor forward(models::Model& model, const torch::Tensor& inputs) override;
  void set_gradient_sync(bool enabled) override;
  // Reduces the gradients of groups that backward left incomplete (parameters without a gradient count
  // as zeros) and waits for every reduction.
  void finish_backward() override;
  torch::Tensor all_reduce_sum(torch::Tensor t) override;
  // This rank's shards: the optimizer's tensors are one flat shard per group, named "zero.<group>".
  std::unique_ptr<UpdateTarget> update_target(models::Model& model, bool master_weights) override;
  // Groups whose gradient reduction has started in this synchronised step (before finish_backward: the
  // overlap with backward).
  size_t groups_reduced() const;

  struct State;

 private:
  ZeroOptions options_;
  std::shared_ptr<State> state_;
};

}  // namespace ptrain::strategies
