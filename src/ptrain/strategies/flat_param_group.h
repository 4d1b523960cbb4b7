// One unit of the sharding engine (zero.h), as PyTorch FSDP2's FSDPParamGroup is one: the unit's
// parameters in one flat buffer (sharding.h's FlatParams), this rank's shard of it, and the four things
// done to them: shard (the initial split, in the constructor), gather (all-gather the whole buffer
// before use, issued from the compute stream), release (free it after use) and reduce (its slot of the strategy's
// GradientReducer: reduce-scatter or all-reduce the gradients into this rank's shard). Where the shards rest (the device, or the CPU with --offload-params) is a property
// of the group, as FSDP2's offload policy is of its FSDPParam.
//
// What the ZeRO stages and FSDP's shardings differ in is ShardingPolicy, answered once from the
// StrategySpec: the group and the engine ask it, never a stage number.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "ptrain/distributed/comm_streams.h"
#include "ptrain/distributed/process_group.h"
#include "ptrain/strategies/gradient_reducer.h"
#include "ptrain/strategies/sharding.h"
#include "ptrain/strategy_spec/strategy_spec.h"

namespace ptrain::strategies {

struct ShardingPolicy {
  // The optimizer steps a shard of each group (zero1-3, fsdp but no-shard); false: every rank holds
  // and steps the whole group, a layout of one shard (fsdp no-shard).
  bool shards_optimizer_state = true;
  // Gradients are reduce-scattered and each rank keeps its shard (zero2, zero3, fsdp's shardings);
  // false: the whole flat gradients are all-reduced.
  bool shards_gradients = false;
  // Parameters rest as this rank's shard and are gathered unit by unit around forward and backward;
  // the groups are the model's units (zero3, fsdp full-shard, shard-grad-op, hybrid-*).
  bool shards_parameters = false;
  // A unit's gathered parameters are freed after its forward and gathered again for its backward
  // (zero3, full-shard, hybrid-shard); false: they stay gathered until its backward is over.
  bool reshards_after_forward = false;
  // Shards within groups of ranks, each group a replica of the others (hybrid-*).
  bool hybrid = false;
  // The parameter shards rest on the CPU between uses (--offload-params).
  bool offload_params = false;
  // The optimizer's shard and its update live on the CPU (--offload-optimizer; fsdp's CPU offload).
  bool offload_optimizer = false;

  // Parameters are replicated but the optimizer steps shards (zero1, zero2): after the step the updated
  // shards are all-gathered into every rank's parameters.
  bool gathers_after_step() const { return shards_optimizer_state && !shards_parameters; }
  // Groups follow the model's units (gathered one at a time) rather than --reduce-bucket-mb.
  bool groups_by_units() const { return shards_parameters; }

  static ShardingPolicy of(const StrategySpec& spec);
};

// The process groups one shard layout lives in (FSDP2's mesh info).
struct ShardMesh {
  std::shared_ptr<distributed::ProcessGroup> all;      // every rank: gradients are averaged over it
  std::shared_ptr<distributed::ProcessGroup> shard;    // the ranks one shard layout spans: all, or a hybrid part
  std::shared_ptr<distributed::ProcessGroup> replica;  // hybrid: the ranks holding this rank's shard; else null

  // hybrid_group_size 0 (or the world size or more): one layout over every rank. Else consecutive groups
  // of that many ranks; the world size must be a multiple of it (`who` names the strategy in the error).
  static ShardMesh of(std::shared_ptr<distributed::ProcessGroup> group, int64_t hybrid_group_size, const std::string& who);
};

class FlatParamGroup {
 public:
  // Lays params (one dtype and device, in the order given) out in one flat buffer over mesh.shard (or
  // a layout of one shard when the policy shards nothing) and, when the policy shards parameters, keeps
  // this rank's shard (on the CPU with offload_params) and frees the buffer. comm_device: where
  // collectives move tensors (the device for NCCL, the CPU for gloo); streams: where all-gathers run.
  FlatParamGroup(std::vector<torch::Tensor> params, std::vector<std::string> names, const ShardingPolicy& policy,
                 ShardMesh mesh, torch::Device device, torch::Device comm_device,
                 std::shared_ptr<distributed::CommStreams> streams);

  const FlatParams& flat() const { return *flat_; }
  const std::vector<std::string>& names() const { return flat_->names(); }

  // Starts gathering the whole buffer from every rank's shard (NCCL: on its own stream), into its storage
  // regrown in place, unless it is gathered or on its way (nothing to do when the policy keeps
  // parameters whole): prefetching.
  void start_gather();
  // ... and waits until it is there: the host (gloo) or the compute stream (NCCL), for this group's
  // all-gather only.
  void gather();
  bool gathered() const { return flat_->allocated(); }
  // Frees the gathered buffer (waiting for a gather in flight); nothing when the policy keeps
  // parameters whole.
  void release();

  // Replicated gradients (the policy does not shard them) live in the flat buffer they are all-reduced in, as
  // DDP's gradient_as_bucket_view: from the group's first gradient of a step (or just before it) each parameter
  // gets its view of that buffer, holding what it had (zeros without a gradient), so that autograd accumulates
  // there and the reduction takes it without a copy. Nothing when gradients are sharded, or bound already.
  void bind_gradients();
  // After the optimizer step: the step's gradient buffers go (the parameters' views of them with them), so that
  // the next forward does not carry a copy of the gradients, as a single device's does not.
  void release_gradients();
  bool holds_gradients() const { return grad_full_.defined() || grad_shard_.defined(); }

  // This group's slot of the strategy's GradientReducer: the parameters' .grad() (cleared as they are read)
  // averaged over every rank into this rank's reduced gradients, all-reduced whole, or reduce-scattered
  // into the shard (then all-reduced across hybrid replicas).
  ReductionSlot reduction();

  // This rank's shard of the parameters (what the optimizer steps) and of the reduced gradients (from the
  // group's reduction to release_gradients()).
  torch::Tensor param_shard() const;
  torch::Tensor grad_shard() const;
  // After the optimizer stepped the shards of replicated parameters: every rank's shard into the whole
  // buffer (ShardingPolicy::gathers_after_step).
  void gather_updated_parameters();
  // A tensor of the flat layout (padded_numel(), on the CPU) into the parameters: the whole buffer, or
  // this rank's shard where parameters rest sharded.
  void load_full(const torch::Tensor& joined);
  // Every rank's shard of a tensor of this layout (shard_numel() elements), as whole per-parameter
  // tensors on the CPU.
  std::vector<torch::Tensor> gather_split(const torch::Tensor& shard) const;

  // Which shard of how many this rank holds (0 of 1 when nothing is sharded).
  int64_t shard_index() const;
  int64_t shard_count() const;
  // What the parameters take on this rank between steps, and the reduced gradients during a step.
  int64_t param_bytes() const;
  int64_t grad_bytes() const;

 private:
  // The parameters' gradients (zeros where there are none) into `into`, a tensor of the flat layout;
  // clears them and holds them in *hold. Gradients that are views of `into` already are left in place.
  void take_grads(const torch::Tensor& into, std::vector<torch::Tensor>* hold);

  ShardingPolicy policy_;
  ShardMesh mesh_;
  torch::Device device_, comm_device_;
  std::shared_ptr<distributed::CommStreams> streams_;
  std::unique_ptr<FlatParams> flat_;
  torch::TensorOptions grad_options_;  // the gradients' dtype and device: the parameters'
  torch::Tensor grad_full_;    // !shards_gradients: the flat gradients, all-reduced in place (during a step)
  torch::Tensor grad_shard_;   // shards_gradients: this rank's shard of the reduced gradients (during a step)
  torch::Tensor param_shard_;  // shards_parameters: this rank's shard of the parameters, kept between uses
  distributed::Work gather_work_;     // an all-gather in flight (prefetch)
  torch::Tensor gather_source_;  // what it sends, alive until it is done
};

}  // namespace ptrain::strategies
