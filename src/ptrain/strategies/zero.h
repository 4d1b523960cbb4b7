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
#pragma once

#include <memory>
#include <string>

#include "ptrain/dist/process_group.h"
#include "ptrain/strategies/strategy.h"

namespace ptrain::strategies {

struct ZeroOptions {
  int stage = 1;
  bool offload_optimizer = false;
  bool offload_params = false;  // stage 3 only
  double reduce_bucket_mb = 25.0;
  // Copy rank 0's buffers (BatchNorm running statistics) to every rank before each training forward.
  bool broadcast_buffers = true;
};

class Zero final : public Strategy {
 public:
  Zero(std::shared_ptr<dist::ProcessGroup> group, torch::Device device, ZeroOptions options);
  ~Zero() override;

  std::string name() const override { return "zero" + std::to_string(options_.stage); }
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

  struct State;

 private:
  ZeroOptions options_;
  std::shared_ptr<State> state_;
};

}  // namespace ptrain::strategies
