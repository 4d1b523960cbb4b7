#include "ptrain/strategies/gradient_reducer.h"

#include "ptrain/core/error.h"
#include "ptrain/strategies/sharding.h"

namespace ptrain::strategies {

GradientReducer::GradientReducer(Options options, std::shared_ptr<distributed::CommStreams> streams)
    : options_(options), streams_(std::move(streams)) {
  check(streams_ != nullptr, "gradient reducer: needs the communication streams");
}

size_t GradientReducer::add_slot(ReductionSlot spec) {
  check(spec.all != nullptr && spec.buffers && spec.fill,
        "gradient reducer: a slot needs its ranks, its buffers and how to fill them");
  Slot slot;
  slot.spec = std::move(spec);
  slots_.push_back(std::move(slot));
  return slots_.size() - 1;
}

void GradientReducer::mark_ready(size_t slot) {
  check(slot < slots_.size(), "gradient reducer: no slot " + std::to_string(slot));
  slots_[slot].ready = true;
  if (options_.overlap) launch_ready();
}

void GradientReducer::launch_ready() {
  while (next_to_launch_ < slots_.size() && slots_[next_to_launch_].ready) launch(slots_[next_to_launch_++]);
}

void GradientReducer::give_back_held_memory() {
  if (!streams_->orders_streams()) return;  // the host waits in finish(); gloo's work holds what it reads
  std::vector<Slot*> holding;
  for (size_t i = 0; i < next_to_launch_; ++i) {
    if (!slots_[i].hold.empty()) holding.push_back(&slots_[i]);
  }
  if (holding.empty()) return;
  // The compute stream waits for their collectives (the backend lets go of their inputs, which the reduce
  // stream prepared before them), then for the reduce stream's work so far.
  for (Slot* slot : holding) slot->work.wait();
  streams_->compute_waits(distributed::CommLane::reduce);
  for (Slot* slot : holding) slot->hold.clear();
}

// Buffers on the compute stream; preparation and collective on the reduce stream, after the compute stream's
// work so far (the backward that produced the gradients).
void GradientReducer::launch(Slot& slot) {
  give_back_held_memory();
  torch::NoGradGuard no_grad;
  const auto& spec = slot.spec;
  const ReductionBuffers buffers = spec.buffers();
  check(buffers.input.defined() && buffers.output.defined(), "gradient reducer: a slot gave no buffers");
  slot.output = buffers.output;
  const auto on_reduce_stream = streams_->after_compute(distributed::CommLane::reduce);
  const auto& input = buffers.input;
  spec.fill(input, &slot.hold);
  if (!input.is_same(slot.output)) slot.hold.push_back(input);
  slot.wire = options_.reduce_dtype.value_or(input.scalar_type());
  const auto travel = reduction_dtype(*spec.all, slot.wire);
  auto summed = slot.wire == input.scalar_type() ? input : input.to(slot.wire);
  if (spec.all->world_size() > 1) summed.div_(spec.all->world_size());
  if (travel != slot.wire) summed = summed.to(travel);
  if (spec.scatter) {
    const auto& out = slot.output;
    const bool into_output = out.scalar_type() == travel && travel == slot.wire && out.is_contiguous();
    slot.result = into_output ? out : torch::empty({out.numel()}, summed.options());
    slot.work = spec.scatter->reduce_scatter_sum(slot.result.view({-1}), summed);
    if (!summed.is_same(input)) slot.hold.push_back(summed);
  } else {
    slot.result = summed;
    std::vector<torch::Tensor> one{summed};
    slot.work = spec.all->all_reduce_sum(one);
  }
}

void GradientReducer::finish() {
  for (auto& slot : slots_) slot.ready = true;
  launch_ready();
  {
    // gloo: the host blocks here; NCCL: the reduce stream is ordered after each collective.
    const auto on_reduce_stream = streams_->on(distributed::CommLane::reduce);
    torch::NoGradGuard no_grad;
    for (auto& slot : slots_) slot.work.wait();
    // Hybrid sharding: every replica reduced its own part of the batch into its shard; the replicas of a
    // shard sum theirs, all in flight before the first is waited on.
    for (auto& slot : slots_) {
      if (!slot.spec.replicas) continue;
      std::vector<torch::Tensor> one{slot.result};
      slot.work = slot.spec.replicas->all_reduce_sum(one);
    }
    for (auto& slot : slots_) {
      slot.work.wait();
      if (slot.result.is_same(slot.output)) continue;
      // Rounded to the dtype it travelled in first: a float32 sum standing in for a bfloat16 one.
      const auto rounded = slot.result.scalar_type() == slot.wire ? slot.result : slot.result.to(slot.wire);
      slot.output.copy_(rounded.view(slot.output.sizes()));
      slot.hold.push_back(rounded);
    }
  }
  streams_->compute_waits(distributed::CommLane::reduce);
  for (auto& slot : slots_) {
    slot.ready = false;
    slot.work = distributed::Work();  // the backend's work holds its tensors: the step's buffers would outlive it
    slot.output = torch::Tensor();
    slot.result = torch::Tensor();
    slot.hold.clear();
  }
  next_to_launch_ = 0;
}

size_t GradientReducer::completed() const {
  size_t done = 0;
  for (size_t i = 0; i < next_to_launch_; ++i) done += slots_[i].work.completed() ? 1 : 0;
  return done;
}

}  // namespace ptrain::strategies
