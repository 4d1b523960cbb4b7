// The streams collectives run on beside the compute stream, as PyTorch FSDP2's FSDPCommContext and llm.c's
// NCCL stream: a reduce lane (gradient reductions: their preparation, the collective, its copy-back) and a
// gather lane (parameter all-gathers). Work enters a lane after an event recorded on the compute stream,
// and the compute stream waits on the lane only where it needs the result: once at the end of backward for
// the reductions, at a unit's use for its all-gather (there by waiting on the gather's distributed::Work).
// Events recorded and waited inside a CUDA graph capture are captured with it; nothing here syncs the host.
// On the CPU (gloo) every call is a no-op: the host waits where a distributed::Work is waited on.
#pragma once

#include <memory>

#include <torch/torch.h>

#include "ptrain/distributed/process_group.h"

namespace ptrain::distributed {

enum class CommLane { reduce, gather };

class CommStreams {
 public:
  virtual ~CommStreams() = default;
  // The lane waits for everything the current (compute) stream has issued so far, and is the current
  // stream until the returned scope is dropped.
  [[nodiscard]] virtual std::shared_ptr<void> after_compute(CommLane lane) = 0;
  // The lane is the current stream until the returned scope is dropped, with no new fence: to complete
  // work issued there earlier.
  [[nodiscard]] virtual std::shared_ptr<void> on(CommLane lane) = 0;
  // The current (compute) stream waits for everything issued on the lane so far.
  virtual void compute_waits(CommLane lane) = 0;
  // Whether waiting on a collective's work orders streams (true) or blocks the host (false): where memory a
  // collective read can go back to the compute stream as soon as that stream has waited for it.
  virtual bool orders_streams() const = 0;
};

// The CPU's lanes (and every lane of a CPU build): collectives run where they are issued, and waiting on their
// work blocks the host.
class HostOrderedStreams final : public CommStreams {
 public:
  std::shared_ptr<void> after_compute(CommLane) override { return nullptr; }
  std::shared_ptr<void> on(CommLane) override { return nullptr; }
  void compute_waits(CommLane) override {}
  bool orders_streams() const override { return false; }
};

// Streams for collectives on `device`: a CUDA device's in CUDA builds, no-ops for the CPU.
std::shared_ptr<CommStreams> make_comm_streams(const torch::Device& device);
// The lanes for `group`'s collectives on `device`: streams where waiting on its work orders a stream (NCCL),
// no-ops where it blocks the host (gloo, whatever the device).
inline std::shared_ptr<CommStreams> make_comm_streams(const ProcessGroup& group, const torch::Device& device) {
  return make_comm_streams(group.stream_ordered() ? device : torch::Device(torch::kCPU));
}

}  // namespace ptrain::distributed
