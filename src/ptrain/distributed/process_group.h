// Collective communication between the processes of one job, over c10d (gloo for CPU tensors, NCCL
// for CUDA ones). Every operation is bounded by the group's timeout: a dead or absent peer turns into
// a ptrain::Error naming the operation, the rank and the world size instead of a hang.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "ptrain/distributed/launch_environment.h"

namespace ptrain::distributed {

class ProcessGroup;

// An operation in flight: every collective returns one and none waits inside, so the caller waits
// where it needs the result, in plain sight. wait() blocks until it completes (gloo, bounded by the
// group's timeout) or until the current CUDA stream is ordered after it (NCCL), then runs the
// completion the operation needs (a copy-back from packed buffers, gloo's reduce-scatter slice) on
// that stream. Waiting twice is harmless.
class [[nodiscard]] Work {
 public:
  Work() = default;
  void wait();
  bool pending() const { return static_cast<bool>(impl_); }
  // Whether the backend has finished the operation, without waiting (true once waited, or for no work).
  // A query for tests and diagnostics: under NCCL it asks the device, which a captured step must not.
  bool completed() const;

  struct Impl;  // defined in process_group.cpp; holds the c10d work items
  explicit Work(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<Impl> impl_;
};

class ProcessGroup {
 public:
  // Rendezvous through a TCPStore hosted by rank 0 at env.master_addr:env.master_port; blocks until
  // every rank has joined or `timeout` passes. backend: "gloo" or "nccl" (CUDA builds only).
  ProcessGroup(const LaunchEnvironment& env, const std::string& backend, std::chrono::milliseconds timeout);
  ~ProcessGroup();

  // Whether this build can form a group over backend: gloo needs LibTorch's gloo headers at build time
  // (PyTorch's wheels, the usual CUDA LibTorch, ship without them), nccl a CUDA build.
  static bool backend_available(const std::string& backend);
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // What the backend asks of its callers, so that none compares backend names:
  // whether collectives take host tensors (gloo) rather than the CUDA device's (NCCL);
  bool needs_host_tensors() const { return kind_ == Kind::gloo; }
  // whether bfloat16 tensors travel and reduce as they are (gloo has no bfloat16: callers move the bits as
  // float16 and reduce in float32);
  bool supports_bf16() const { return kind_ != Kind::gloo; }
  // whether waiting on work orders the current CUDA stream after it (NCCL) instead of blocking the host (gloo).
  bool stream_ordered() const { return kind_ == Kind::nccl; }
  // whether an all-gather may read each rank's input from its own slot of the output (NCCL's in-place
  // all-gather); gloo copies through its input, which then needs storage of its own.
  bool gathers_in_place() const { return kind_ == Kind::nccl; }

  // Each tensor becomes its sum over all ranks, in place. Tensors of different sizes and dtypes are
  // fine (they are packed into one flat buffer per dtype); one contiguous tensor goes as it is.
  Work all_reduce_sum(std::vector<torch::Tensor>& tensors);
  // Every rank's tensors take root's values, in place.
  Work broadcast(std::vector<torch::Tensor>& tensors, int64_t root);
  Work barrier();
  // *per_rank gets one tensor per rank, in rank order, views of one flat buffer filled once the work
  // is waited on.
  Work all_gather(const torch::Tensor& input, std::vector<torch::Tensor>* per_rank);
  // output_flat (world_size * input_shard.numel() elements) gets every rank's shard, in rank order.
  // Both tensors must stay alive until the work is waited on.
  Work all_gather_into(const torch::Tensor& output_flat, const torch::Tensor& input_shard);
  // output_shard gets this rank's slice of the sum over ranks of input_flat. gloo has no reduce-scatter
  // in LibTorch 1.13, so there it is an all-reduce of a copy whose slice the wait copies out: correct,
  // but it moves world_size times the data a real reduce-scatter would.
  Work reduce_scatter_sum(const torch::Tensor& output_shard, const torch::Tensor& input_flat);

  // Every rank's text, in rank order, exchanged through the rendezvous store under `name` (one name a
  // call): settings and other small strings, whatever the backend. Collective; rank 0, which hosts the
  // store, returns only once every rank has read them all.
  std::vector<std::string> all_gather_text(const std::string& name, const std::string& text);

  // A group of some of this group's ranks (`ranks`, in this group's numbering, this rank among them),
  // its own communicator under `name`: hybrid sharding's shard and replica groups. Only the members
  // call it, every member with the same ranks and name; it rendezvouses through this group's store.
  std::shared_ptr<ProcessGroup> subgroup(const std::vector<int64_t>& ranks, const std::string& name);

 private:
  enum class Kind { gloo, nccl };
  static std::optional<Kind> backend_kind(const std::string& name);  // nullopt: a name ptrain does not know
  static Kind known_backend(const std::string& name);  // throws, naming --backend, for any other name
  static std::string backend_name(Kind kind);
  ProcessGroup(int64_t rank, int64_t world_size, Kind kind, std::chrono::milliseconds timeout);
  struct Backend;
  std::string where() const;  // "rank 1 of 3 (gloo, timeout 5 s)", for error messages
  // A work item for `operation` on this group: where it runs, its timeout, and how waiting on it orders
  // (NCCL: the stream; gloo: the host).
  std::shared_ptr<Work::Impl> new_work(const std::string& operation) const;

  int64_t rank_;
  int64_t world_size_;
  Kind kind_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Backend> impl_;
};

}  // namespace ptrain::distributed
