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

ShardMesh ShardMesh::of(std::shared_ptr<dist::ProcessGroup> group, int64_t hybrid_group_size, const std::string& who) {
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
                               torch::Device comm_device)
    : policy_(policy), mesh_(std::move(mesh)), device_(device), comm_device_(comm_device) {
  torch::NoGradGuard no_grad;
  flat_ = policy_.shards_optimizer_state
              ? std::make_unique<FlatParams>(std::move(params), std::move(names), mesh_.shard->rank(),
                                             mesh_.shard->world_size())
              : std::make_unique<FlatParams>(std::move(params), std::move(names), 0, 1);
  const auto options = flat_->full().options();
  if (policy_.shards_gradients) {
    grad_shard_ = torch::zeros({flat_->shard_numel()}, options);
  } else {
    grad_full_ = torch::zeros({flat_->padded_numel()}, options);
  }
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
  flat_->regrow();
  torch::NoGradGuard no_grad;
  gather_source_ = as_movable(*mesh_.shard, param_shard_.to(device_));
  gather_work_ = mesh_.shard->all_gather_into_async(as_movable(*mesh_.shard, flat_->full()), gather_source_);
}

void FlatParamGroup::gather() {
  start_gather();
  gather_work_.wait();
  gather_source_ = torch::Tensor();
}

void FlatParamGroup::release() {
  if (!policy_.shards_parameters) return;
  gather_work_.wait();
  gather_source_ = torch::Tensor();
  flat_->free();
}

void FlatParamGroup::reduce(std::optional<torch::ScalarType> reduce_dtype) {
  torch::NoGradGuard no_grad;
  auto flat = flat_->flat_grads(1.0 / static_cast<double>(mesh_.all->world_size()));
  for (const auto& p : flat_->params()) torch::Tensor(p).mutable_grad().reset();
  // gloo sums no bfloat16: there the bfloat16 values are summed in float32 and the sum rounded to
  // bfloat16 once (for two ranks exactly what a bfloat16 sum gives).
  const auto wire = reduce_dtype.value_or(flat.scalar_type());
  const auto travel = reduction_dtype(*mesh_.all, wire);
  if (wire != flat.scalar_type() || travel != flat.scalar_type()) {
    auto converted = flat.to(wire).to(travel);
    if (!policy_.shards_gradients) {
      std::vector<torch::Tensor> one{converted};
      mesh_.all->all_reduce_sum(one).wait();
      grad_full_ = converted.to(wire).to(flat.scalar_type());
    } else {
      auto shard = torch::empty({flat_->shard_numel()}, converted.options());
      mesh_.shard->reduce_scatter_sum(shard, converted);
      reduce_across_replicas(shard);
      grad_shard_.copy_(shard.to(wire));
    }
  } else if (!policy_.shards_gradients) {
    grad_full_ = flat;
    std::vector<torch::Tensor> one{grad_full_};
    work_ = mesh_.all->all_reduce_sum(one);
  } else {
    mesh_.shard->reduce_scatter_sum(grad_shard_, flat);
    reduce_across_replicas(grad_shard_);
  }
}

void FlatParamGroup::wait_reduce() { work_.wait(); }

// Hybrid sharding: every replica reduced its own part of the batch into its shard; the replicas of a
// shard sum theirs.
void FlatParamGroup::reduce_across_replicas(const torch::Tensor& shard) {
  if (!mesh_.replica) return;
  std::vector<torch::Tensor> one{shard};
  mesh_.replica->all_reduce_sum(one).wait();
}

torch::Tensor FlatParamGroup::param_shard() const {
  return policy_.shards_parameters ? param_shard_ : flat_->shard();
}

torch::Tensor FlatParamGroup::grad_shard() const {
  return policy_.shards_gradients ? grad_shard_ : flat_->shard_of(grad_full_);
}

void FlatParamGroup::gather_updated_parameters() {
  torch::NoGradGuard no_grad;
  auto shard = flat_->shard().clone();
  mesh_.shard->all_gather_into(as_movable(*mesh_.shard, flat_->full()), as_movable(*mesh_.shard, shard));
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
  shards.all_gather_into(as_movable(shards, whole), as_movable(shards, shard.to(comm_device_)));
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
  return policy_.shards_gradients ? bytes_of(grad_shard_) : bytes_of(grad_full_);
}

}  // namespace ptrain::strategies
