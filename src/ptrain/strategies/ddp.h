// Data parallelism after PyTorch's DistributedDataParallel: one model replica per process, gradients
// averaged over ranks during backward. Parameters are grouped into buckets (by dtype and device, in
// reverse registration order, which approximates the order backward produces gradients); a hook on
// each parameter's gradient accumulator counts its bucket's gradients and a full bucket starts its asynchronous
// all-reduce at once, so communication overlaps the rest of backward. Each parameter's .grad is a view of its
// bucket (gradient_as_bucket_view): autograd accumulates into the bucket, which is averaged in place.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ptrain/distributed/process_group.h"
#include "ptrain/strategies/strategy.h"
#include "ptrain/strategies/sync_batchnorm.h"

namespace ptrain::strategies {

struct DdpOptions {
  double bucket_cap_mb = 25.0;
  // Small, so the first all-reduce starts early in backward (DDP's first bucket).
  double first_bucket_mb = 1.0;
  // Copy rank 0's buffers (BatchNorm running statistics) to every rank before each training forward.
  bool broadcast_buffers = true;
  // Replace BatchNorm2d layers by SyncBatchNorm2d at prepare() (see sync_batchnorm.h for the condition).
  bool sync_batchnorm = false;
  // Gradient compression (--reduce-dtype), as PyTorch's bf16_compress_hook and fp16_compress_hook: each
  // bucket is cast to this dtype, divided by the world size there, summed over the ranks and cast back.
  // Over gloo, which sums no bfloat16, the bfloat16 values are summed in float32 and the sum rounded to
  // bfloat16 once (for two ranks exactly a bfloat16 sum). Unset: buckets reduce in the gradients' dtype.
  std::optional<torch::ScalarType> reduce_dtype;
  // Start each bucket's all-reduce as soon as backward has filled it (false: all of them in
  // finish_backward, after backward). Only the timing differs. Either way the one wait is in
  // finish_backward (gradient_reducer.h).
  bool overlap = true;
};

class DistributedDataParallel final : public Strategy {
 public:
  DistributedDataParallel(std::shared_ptr<distributed::ProcessGroup> group, torch::Device device, DdpOptions options = {});
  ~DistributedDataParallel() override;

  std::string name() const override { return "ddp"; }
  int64_t rank() const override { return group_->rank(); }
  int64_t world_size() const override { return group_->world_size(); }

  // Checks that every rank holds the same parameter shapes, copies rank 0's parameters and buffers to
  // all ranks, builds the buckets and installs the gradient hooks.
  void prepare(models::Model& model) override;
  torch::Tensor forward(models::Model& model, const torch::Tensor& inputs) override;
  // With false, backward communicates nothing and gradients accumulate locally; the next synchronised
  // backward then reduces the accumulated sums.
  void set_gradient_sync(bool enabled) override;
  // Waits for every bucket; each parameter's .grad is then its averaged bucket view (a gradient someone set to a
  // tensor of its own gets the average copied into it). A
  // parameter that received no gradient in this step contributes zeros (or its gradient accumulated in
  // earlier unsynchronised micro-steps): that approximates find_unused_parameters=True without its
  // graph traversal, and keeps every rank issuing the same collectives.
  void finish_backward() override;
  torch::Tensor all_reduce_sum(torch::Tensor t) override;
  void sync_buffers() override;
  std::vector<std::string> all_gather_text(const std::string& name, const std::string& text) override {
    return group_->all_gather_text(name, text);
  }
  // Over NCCL every collective of the step is ordered on the device (its buckets are fixed at prepare()), so the
  // whole step, all-reduces included, can be recorded once and replayed.
  std::string capture_obstacle() const override;

  // Parameter indices (in model.parameters() order) of each bucket, in all-reduce order.
  std::vector<std::vector<size_t>> bucket_layout() const;
  // Buckets whose all-reduce has started in this synchronised step (before finish_backward: the
  // overlap with backward).
  size_t reductions_started() const;
  // Of those, the ones whose all-reduce has completed, asked without waiting (tests: reductions in flight).
  size_t reductions_completed() const;
  // Buckets the strategy holds memory of: from their first gradient of a step to the end of its reduction, after
  // which they live only in the gradients (tests: nothing held between steps).
  size_t buckets_held() const;
  distributed::ProcessGroup& group() { return *group_; }

  struct Reducer;

 private:
  std::shared_ptr<distributed::ProcessGroup> group_;
  torch::Device device_;
  DdpOptions options_;
  std::shared_ptr<Reducer> reducer_;
  std::vector<ConvertedNorm> sync_norms_;
  std::vector<torch::Tensor> buffer_flats_;  // the model's buffers are views of these (sharding.h's flatten_in_place)
};

}  // namespace ptrain::strategies
