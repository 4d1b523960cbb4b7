// The one gradient reducer of the data-parallel strategies (flashlight's Reducer: add, then finalize):
// DDP's buckets and the flat parameter groups of the ZeRO stages and FSDP are its slots. A slot is a flat
// buffer of gradients averaged over the ranks: all-reduced whole, or reduce-scattered into this rank's
// shard and then (hybrid sharding) all-reduced across the replicas of that shard.
//
// The backward hook marks a slot ready once all its gradients are there; with overlap a ready slot is
// launched at once, strictly in slot order, so every rank issues the same collectives whatever order its
// hooks fire in. Nothing waits for a result before finish(), which runs once at the end of backward: it
// launches what is left, waits for every slot and copies the averages out. On CUDA the preparation (copy into
// the flat buffer, division, dtype casts), the collective and the copy-back run on the reduce stream
// (distributed/comm_streams.h) after an event of the compute stream, and finish() makes the compute stream wait
// on the reduce stream, once. What a launched reduction reads beside the gradients' own storage (a
// reduce-scatter's transient flat buffer, the gradients copied into it) is given back one slot later, as
// FSDP2 frees each reduce-scatter's input at the next: the compute stream waits for that slot's collective,
// then drops it, so that backward reuses the memory instead of holding every group's copy until finish().
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <torch/torch.h>

#include "ptrain/distributed/comm_streams.h"
#include "ptrain/distributed/process_group.h"

namespace ptrain::strategies {

// What a slot reduces when it launches: its flat gradients in their own dtype, and where their average lands (a
// tensor of the flat layout, or of this rank's shard with a scatter group); one tensor when reduced in place.
struct ReductionBuffers {
  torch::Tensor input;
  torch::Tensor output;
};

struct ReductionSlot {
  // Gradients are averaged over these ranks (divided by its world size) and, without a scatter group,
  // all-reduced over it.
  std::shared_ptr<distributed::ProcessGroup> all;
  std::shared_ptr<distributed::ProcessGroup> scatter;   // set: reduce-scattered over it into this rank's shard
  std::shared_ptr<distributed::ProcessGroup> replicas;  // set: the shard then all-reduced across these ranks
  // On the compute stream, when the slot launches: its buffers, allocated there when they are new, so that their
  // memory goes back to the compute stream (and, inside a CUDA graph capture, to the step's own pool) once it
  // has waited for the reduction.
  std::function<ReductionBuffers()> buffers;
  // On the reduce stream, after the compute stream's work so far: the parameters' gradients into `input` (a
  // no-op for gradients living there already); what it reads that must outlive the reduction goes into *hold.
  std::function<void(const torch::Tensor& input, std::vector<torch::Tensor>* hold)> fill;
};

class GradientReducer {
 public:
  struct Options {
    // The dtype gradients travel and are summed in (--reduce-dtype, PyTorch's bf16/fp16_compress_hook: cast,
    // divided by the world size there, summed, cast back); unset: their own. gloo sums no bfloat16: there
    // the bfloat16 values are summed in float32 and the sum rounded to bfloat16 once (for two ranks exactly
    // a bfloat16 sum).
    std::optional<torch::ScalarType> reduce_dtype;
    // Launch slots during backward as they become ready (false: all of them in finish()). Only the timing
    // differs.
    bool overlap = true;
  };

  GradientReducer(Options options, std::shared_ptr<distributed::CommStreams> streams);
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Slots launch in the order they are added. Returns the slot's index.
  size_t add_slot(ReductionSlot slot);
  // The slot's gradients are all there (once per step; callers serialise their calls).
  void mark_ready(size_t slot);
  // Launches every slot not launched yet (their missing gradients count as zeros, as prepare fills them),
  // waits for all of them and writes each average into its output; then the next step can begin.
  void finish();

  size_t slots() const { return slots_.size(); }
  // Slots whose collectives this step has issued (before finish(): the overlap with backward).
  size_t launched() const { return next_to_launch_; }
  // Launched slots whose first collective the backend reports done, without waiting: for tests. Under NCCL
  // it queries the device, which a captured step must not do.
  size_t completed() const;

 private:
  struct Slot {
    ReductionSlot spec;
    bool ready = false;
    distributed::Work work;            // the collective in flight
    torch::Tensor output;       // this step's: where the average lands
    torch::Tensor result;       // what it reduces into: the output itself, or a tensor in the travel dtype
    torch::ScalarType wire = torch::kFloat;  // the dtype the sum is rounded to before the copy-out
    std::vector<torch::Tensor> hold;  // alive until the compute stream has waited on the reduction
  };
  void launch_ready();
  void launch(Slot& slot);
  // Stream-ordered collectives: the compute stream waits for the launched slots that hold memory, which is
  // then dropped.
  void give_back_held_memory();

  Options options_;
  std::shared_ptr<distributed::CommStreams> streams_;
  std::vector<Slot> slots_;
  size_t next_to_launch_ = 0;
};

}  // namespace ptrain::strategies
