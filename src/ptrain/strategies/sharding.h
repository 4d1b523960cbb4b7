// The machinery the data-parallel strategies share: how parameters are grouped for the reduction of
// their gradients (DDP's buckets, the ZeRO stages' and FSDP's groups) and, for the sharded strategies,
// parameters of one dtype laid out back to back in one flat buffer, padded so that it splits into
// world_size shards of equal size; the
// parameters themselves become views of that buffer, so one collective over the buffer moves them all,
// and a shard is a plain offset. The buffer's storage can be freed and regrown in place: parameter
// objects, and the views autograd saved of them, stay valid across the gap.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "ptrain/distributed/process_group.h"

namespace ptrain::models {
class Model;
}

namespace ptrain::strategies {

class FlatParams {
 public:
  // params: one dtype and device; they keep their values and become views of full(). Rank and world
  // size fix which shard is this rank's.
  FlatParams(std::vector<torch::Tensor> params, std::vector<std::string> names, int64_t rank, int64_t world_size);

  const std::vector<torch::Tensor>& params() const { return params_; }
  const std::vector<std::string>& names() const { return names_; }
  int64_t numel() const { return numel_; }                // the parameters' elements, without padding
  int64_t shard_numel() const { return shard_numel_; }    // every rank's shard, padding included
  int64_t padded_numel() const { return shard_numel_ * world_size_; }
  int64_t offset(size_t i) const { return offsets_[i]; }  // where parameter i starts in the flat layout

  // The padded flat buffer whose storage the parameters view, and this rank's slice of it.
  const torch::Tensor& full() const { return full_; }
  torch::Tensor shard() const { return shard_of(full_); }
  // This rank's slice of any tensor of the flat layout (padded_numel() elements).
  torch::Tensor shard_of(const torch::Tensor& flat) const;

  // The flat layout of per-parameter tensors (in params() order, each of its parameter's shape), and back:
  // split() returns views of flat with each parameter's shape and strides.
  torch::Tensor join(const std::vector<torch::Tensor>& per_param, const torch::TensorOptions& options) const;
  std::vector<torch::Tensor> split(const torch::Tensor& flat) const;

  // Releases the storage of full() (the parameters keep their shapes but hold no data until regrow()),
  // and allocates it again; regrow() leaves the contents undefined.
  void free();
  void regrow();
  bool allocated() const { return allocated_; }

 private:
  torch::Tensor view_of(const torch::Tensor& flat, size_t i) const;

  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<int64_t> offsets_;
  int64_t rank_, world_size_, numel_ = 0, shard_numel_ = 0;
  torch::Tensor full_;
  bool allocated_ = true;
};

// Parameter indices in groups of one dtype and device, each at most cap_bytes (a parameter larger than
// the cap is a group alone), walking the parameters in reverse order: the order in which backward
// usually produces their gradients.
std::vector<std::vector<size_t>> group_by_size(const std::vector<torch::Tensor>& params, int64_t cap_bytes);

// The groups of the strategies that gather parameters unit by unit (zero3, fsdp): one per wrapped unit of
// models::Model::units(), then the root (parameters outside every wrapped unit, or all of them without
// units). wrap: which group each unit joins (neighbouring units may share one), -1 for the root; unset:
// every unit its own. `who` names the strategy in errors.
struct UnitLayout {
  std::vector<std::vector<size_t>> groups;  // indices into params, in the order backward completes them
  std::vector<int> unit_group;              // per unit, its group or -1 (the root)
  int rest_group = -1;                      // the root's group; -1 when every parameter is in a unit
  // Per group, the group whose forward runs just before its own (-1: none): the one backward reaches next.
  std::vector<int> before;
};
UnitLayout unit_layout(models::Model& model, const std::vector<torch::Tensor>& params,
                       const std::optional<std::vector<int>>& wrap, const std::string& who);

// DDP's gradient buckets, as PyTorch's reducer makes them: walking the parameters in reverse, one open
// bucket per dtype and device closes once it reaches its cap (the first of each kind first_cap_bytes,
// later ones cap_bytes); members in the order backward fills them.
std::vector<std::vector<size_t>> ddp_buckets(const std::vector<torch::Tensor>& params, int64_t first_cap_bytes,
                                             int64_t cap_bytes);

// Whether grad is `view` itself (the same memory, laid out the same): a gradient that lives in its reduction
// buffer (ddp's buckets, the flat groups' replicated gradients), which autograd accumulated into in place.
bool is_gradient_view(const torch::Tensor& grad, const torch::Tensor& view);
// Each parameter's gradient moves into its view of a reduction buffer and becomes that view, so that autograd
// accumulates there: DDP's buckets and the flat groups' gradient buffers. The buffer comes zeroed (one fill, where a
// fill a parameter costs a kernel each: ddp on GPT-2 small, one H200, 445.6 against 443.9 sequences/s), so a
// parameter without a gradient keeps zeros.
void bind_gradients_to_views(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& views);

// Makes the tensors (a model's buffers: batch-norm running statistics) views of one flat buffer per dtype and
// device, keeping their values and the tensor objects the model holds, and returns those flat buffers: one
// collective over them then moves every tensor, with nothing to pack or unpack (ddp's and zero's per-step
// buffer broadcast). Tensors replaced later (rather than written in place) would leave their flat buffer.
std::vector<torch::Tensor> flatten_in_place(const std::vector<torch::Tensor>& tensors);

// --bucket-cap-mb and the other MiB flags, in bytes.
int64_t megabytes_to_bytes(double mb);

// gloo in LibTorch 1.13 moves no bfloat16. For collectives that only copy (broadcast, all-gather), a
// bfloat16 tensor travels as the same bits viewed as float16; other tensors as they are.
torch::Tensor as_movable(const distributed::ProcessGroup& group, const torch::Tensor& t);
// The dtype gradients of `dtype` are summed in: float32 for bfloat16 over gloo, else their own.
torch::ScalarType reduction_dtype(const distributed::ProcessGroup& group, torch::ScalarType dtype);

// Checks that every rank holds the same parameter shapes (or names `who` and the rank that differs),
// then, with broadcast, copies rank 0's parameters and buffers to all ranks.
void check_and_broadcast(distributed::ProcessGroup& group, const std::vector<torch::Tensor>& params,
                         const std::vector<torch::Tensor>& buffers, const torch::Device& device, const std::string& who,
                         bool broadcast = true);

}  // namespace ptrain::strategies
