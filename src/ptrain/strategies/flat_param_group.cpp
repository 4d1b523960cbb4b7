#include "ptrain/strategies/flat_param_group.h"

#include "ptrain/core/error.h"
#include "ptrain/strategies/strategy.h"

namespace ptrain::strategies {

ShardingPolicy ShardingPolicy::of(const StrategySpec& spec) {
  check(spec.uses_flat_groups(), spec.name() + ": runs on no flat parameter groups");
  ShardingPolicy policy;
  policy.shards_optimizer_state = spec.shards_optimizer_state();
  policy.shards_gradients = spec.shards_gradients();
  policy.shards_parameters = spec.shards_parameters();
  policy.reshards_after_forward = spec.reshards_after_forward();
  policy.hybrid = spec.hybrid();
  return policy;
}

ShardMesh ShardMesh::of(std::shared_ptr<distributed::ProcessGroup> group, int64_t hybrid_group_size, const std::string& who) {
  ShardMesh mesh;
  mesh.all = std::move(group);
  mesh.shard = mesh.all;
  const int64_t world = mesh.all->world_size(), rank = mesh.all->rank();
  if (hybrid_group_size > 0 && hybrid_group_size < world) {
    const int64_t size = hybrid_group_size;
    check(world % size == 0, who + ": hybrid sharding in groups of " + std::to_string(size) +
                                 " ranks needs a world size divisible by it, not " + std::to_string(world));
    std::vector<int64_t> shard_ranks, replica_ranks;
    for (int64_t r = 0; r < size; ++r) shard_ranks.push_back(rank / size * size + r);
    for (int64_t r = rank % size; r < world; r += size) replica_ranks.push_back(r);
    mesh.shard = mesh.all->subgroup(shard_ranks, "shard" + std::to_string(rank / size));
    mesh.replica = mesh.all->subgroup(replica_ranks, "replica" + std::to_string(rank % size));
  }
  return mesh;
}

FlatParamGroup::FlatParamGroup(std::vector<torch::Tensor> params, std::vector<std::string> names,
                               const ShardingPolicy& policy, ShardMesh mesh, torch::Device device,
                               torch::Device comm_device, std::shared_ptr<distributed::CommStreams> streams)
    : policy_(policy), mesh_(std::move(mesh)), device_(device), comm_device_(comm_device), streams_(std::move(streams)) {
  check(streams_ != nullptr, "flat parameter group: needs the communication streams");
  torch::NoGradGuard no_grad;
  flat_ = policy_.shards_optimizer_state
              ? std::make_unique<FlatParams>(std::move(params), std::move(names), mesh_.shard->rank(),
                                             mesh_.shard->world_size())
              : std::make_unique<FlatParams>(std::move(params), std::move(names), 0, 1);
  grad_options_ = flat_->full().options().requires_grad(false);
  if (policy_.shards_parameters) {
    param_shard_ = flat_->shard().clone();
    if (policy_.offload_params) {
      param_shard_ = param_shard_.to(torch::kCPU);
      if (device_.is_cuda()) param_shard_ = param_shard_.pin_memory();
    }
    flat_->free();
  }
}

void FlatParamGroup::start_gather() {
  if (flat_->allocated()) return;
  // Regrown on the compute stream, which uses and frees the buffer.
  flat_->regrow();
  // Issued from the compute stream: NCCL runs it on its own stream, after the compute stream's work so far and
  // beside what follows. The gather lane stands in between only where the shard first crosses from the CPU, so
  // that the copy does not hold the compute stream: a lane costs two more stream hops per unit, which inside a
  // captured step split the graph into a branch per unit (zero3 on GPT-2 small, one H200, each against single
  // in the same call: 0.88x through the lane, both traced; 0.95x without; docs/results, 2026-12-03 strategies).
  const auto on_gather_stream = policy_.offload_params ? streams_->after_compute(distributed::CommLane::gather) : nullptr;
  // Out of place, from the shard itself. FSDP2's way, the shard copied into its slot of the buffer on the issuing
  // stream and gathered in place, measured slower: the copy then holds the compute stream (zero3 on GPT-2 small,
  // world size 1, one H200: 420.4 against 427.8 sequences/s, one call; docs/results, 2026-12-04 strategies).
  torch::NoGradGuard no_grad;
  gather_source_ = as_movable(*mesh_.shard, param_shard_.to(device_));
  gather_work_ = mesh_.shard->all_gather_into(as_movable(*mesh_.shard, flat_->full()), gather_source_);
}

void FlatParamGroup::gather() {
  start_gather();
  // gloo: the host waits for the all-gather. NCCL: the compute stream waits for this all-gather only,
  // and for what the gather stream did before it (the shard's copy from the CPU with --offload-params),
  // which also joins that stream back into a CUDA graph being captured.
  gather_work_.wait();
  if (policy_.offload_params) streams_->compute_waits(distributed::CommLane::gather);
  gather_source_ = torch::Tensor();
}

void FlatParamGroup::release() {
  if (!policy_.shards_parameters) return;
  gather_work_.wait();
  gather_source_ = torch::Tensor();
  flat_->free();
}

ReductionSlot FlatParamGroup::reduction() {
  ReductionSlot slot;
  slot.all = mesh_.all;
  if (policy_.shards_gradients) {
    slot.scatter = mesh_.shard;
    slot.replicas = mesh_.replica;
    // A transient flat buffer of the whole gradients, given back once reduce-scattered, and this rank's shard.
    slot.buffers = [this] {
      grad_shard_ = torch::empty({flat_->shard_numel()}, grad_options_);
      return ReductionBuffers{torch::empty({flat_->padded_numel()}, grad_options_), grad_shard_};
    };
  } else {
    // Reduced in place, in the buffer the gradients live in.
    slot.buffers = [this] {
      bind_gradients();
      return ReductionBuffers{grad_full_, grad_full_};
    };
  }
  slot.fill = [this](const torch::Tensor& flat, std::vector<torch::Tensor>* hold) { take_grads(flat, hold); };
  return slot;
}

void FlatParamGroup::bind_gradients() {
  if (policy_.shards_gradients || grad_full_.defined()) return;
  torch::NoGradGuard no_grad;
  grad_full_ = torch::zeros({flat_->padded_numel()}, grad_options_);
  bind_gradients_to_views(flat_->params(), flat_->split(grad_full_));
}

void FlatParamGroup::release_gradients() {
  torch::NoGradGuard no_grad;
  if (grad_full_.defined()) {
    const auto views = flat_->split(grad_full_);
    for (size_t i = 0; i < views.size(); ++i) {
      auto& grad = flat_->params()[i].mutable_grad();
      if (is_gradient_view(grad, views[i])) grad.reset();
    }
  }
  grad_full_ = torch::Tensor();
  grad_shard_ = torch::Tensor();
}

// A device copy per parameter: contiguous ones become the driver's 16-byte copy kernels, which move a GPT-2 block's
// gradients faster than one cat kernel over the group does (tried: zero3 on GPT-2 small, world size 1, one H200,
// 428.7 sequences/s with the cat against 431.8 with these copies, single 453.3, all in one call; docs/results,
// 2026-12-04 strategies).
void FlatParamGroup::take_grads(const torch::Tensor& into, std::vector<torch::Tensor>* hold) {
  torch::NoGradGuard no_grad;
  into.narrow(0, flat_->numel(), flat_->padded_numel() - flat_->numel()).zero_();
  const auto views = flat_->split(into);
  for (size_t i = 0; i < views.size(); ++i) {
    auto param = flat_->params()[i];
    auto& grad = param.mutable_grad();
    if (is_gradient_view(grad, views[i])) continue;
    if (grad.defined()) {
      views[i].copy_(grad);
      hold->push_back(grad);
      grad.reset();
    } else {
      views[i].zero_();
    }
  }
}

torch::Tensor FlatParamGroup::param_shard() const {
  return policy_.shards_parameters ? param_shard_ : flat_->shard();
}

torch::Tensor FlatParamGroup::grad_shard() const {
  return policy_.shards_gradients ? grad_shard_ : flat_->shard_of(grad_full_);
}

void FlatParamGroup::gather_updated_parameters() {
  torch::NoGradGuard no_grad;
  auto& shards = *mesh_.shard;
  const auto shard = shards.gathers_in_place() ? flat_->shard() : flat_->shard().clone();
  shards.all_gather_into(as_movable(shards, flat_->full()), as_movable(shards, shard)).wait();
}

void FlatParamGroup::load_full(const torch::Tensor& joined) {
  torch::NoGradGuard no_grad;
  if (policy_.shards_parameters) {
    param_shard_.copy_(flat_->shard_of(joined));
  } else {
    flat_->full().copy_(joined);
  }
}

std::vector<torch::Tensor> FlatParamGroup::gather_split(const torch::Tensor& shard) const {
  std::vector<torch::Tensor> out;
  if (!policy_.shards_optimizer_state) {
    for (const auto& part : flat_->split(shard)) out.push_back(part.to(torch::kCPU).clone());
    return out;
  }
  auto& shards = *mesh_.shard;
  auto whole = torch::empty({flat_->padded_numel()}, shard.options().device(comm_device_));
  shards.all_gather_into(as_movable(shards, whole), as_movable(shards, shard.to(comm_device_))).wait();
  for (const auto& part : flat_->split(whole)) out.push_back(part.to(torch::kCPU).clone());
  return out;
}

int64_t FlatParamGroup::shard_index() const { return policy_.shards_optimizer_state ? mesh_.shard->rank() : 0; }
int64_t FlatParamGroup::shard_count() const {
  return policy_.shards_optimizer_state ? mesh_.shard->world_size() : 1;
}

int64_t FlatParamGroup::param_bytes() const {
  return policy_.shards_parameters ? bytes_of(param_shard_) : bytes_of(flat_->full());
}
int64_t FlatParamGroup::grad_bytes() const {
  const int64_t numel = policy_.shards_gradients ? flat_->shard_numel() : flat_->padded_numel();
  return numel * static_cast<int64_t>(c10::elementSize(c10::typeMetaToScalarType(grad_options_.dtype())));
}

}  // namespace ptrain::strategies
