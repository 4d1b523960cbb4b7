#include "ptrain/strategies/sharding.h"

#include <algorithm>
#include <map>

#include <c10/core/StorageImpl.h>

#include "ptrain/core/error.h"
#include "ptrain/models/model.h"

namespace ptrain::strategies {

FlatParams::FlatParams(std::vector<torch::Tensor> params, std::vector<std::string> names, int64_t rank,
                       int64_t world_size)
    : params_(std::move(params)), names_(std::move(names)), rank_(rank), world_size_(world_size) {
  check(!params_.empty(), "sharding: a flat group needs at least one parameter");
  check(params_.size() == names_.size(), "sharding: one name per parameter is needed");
  check(world_size_ > 0 && rank_ >= 0 && rank_ < world_size_, "sharding: rank outside the world");
  const auto dtype = params_.front().scalar_type();
  const auto device = params_.front().device();
  for (size_t i = 0; i < params_.size(); ++i) {
    check(params_[i].scalar_type() == dtype && params_[i].device() == device,
          "sharding: parameter '" + names_[i] + "' differs in dtype or device from '" + names_.front() +
              "' of its flat group");
    check(params_[i].is_non_overlapping_and_dense(), "sharding: parameter '" + names_[i] + "' is not dense");
    offsets_.push_back(numel_);
    numel_ += params_[i].numel();
  }
  shard_numel_ = (numel_ + world_size_ - 1) / world_size_;
  full_ = torch::zeros({padded_numel()}, params_.front().options().requires_grad(false));
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto view = view_of(full_, i);
    view.copy_(params_[i].detach());
    // set_data keeps the parameter object (and its autograd identity and version counter) and makes it
    // a view of the flat storage.
    params_[i].set_data(view);
  }
}

torch::Tensor FlatParams::view_of(const torch::Tensor& flat, size_t i) const {
  // The parameter's own strides (channels-last stays channels-last) over its dense span of the flat layout.
  return flat.as_strided(params_[i].sizes(), params_[i].strides(), flat.storage_offset() + offsets_[i]);
}

torch::Tensor FlatParams::shard_of(const torch::Tensor& flat) const {
  check(flat.numel() == padded_numel(), "sharding: shard_of a tensor outside the flat layout");
  return flat.narrow(0, rank_ * shard_numel_, shard_numel_);
}

torch::Tensor FlatParams::join(const std::vector<torch::Tensor>& per_param, const torch::TensorOptions& options) const {
  check(per_param.size() == params_.size(), "sharding: join needs one tensor per parameter");
  torch::NoGradGuard no_grad;
  auto flat = torch::zeros({padded_numel()}, options);
  for (size_t i = 0; i < params_.size(); ++i) {
    check(per_param[i].sizes() == params_[i].sizes(), "sharding: '" + names_[i] + "' has shape " +
                                                          c10::str(per_param[i].sizes()) + ", expected " +
                                                          c10::str(params_[i].sizes()));
    view_of(flat, i).copy_(per_param[i]);
  }
  return flat;
}

std::vector<torch::Tensor> FlatParams::split(const torch::Tensor& flat) const {
  check(flat.numel() == padded_numel() && flat.is_contiguous(), "sharding: split needs a contiguous flat tensor");
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < params_.size(); ++i) out.push_back(view_of(flat, i));
  return out;
}

void FlatParams::free() {
  if (!allocated_) return;
  auto* storage = full_.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, full_.device()));
  storage->set_nbytes(0);
  allocated_ = false;
}

void FlatParams::regrow() {
  if (allocated_) return;
  auto* storage = full_.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(padded_numel()) * full_.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
  allocated_ = true;
}

namespace {

// Parameter indices walked in reverse, one open group per dtype and device. close_before_overflow: a
// group closes before a parameter would take it past its cap (a larger parameter is a group alone);
// otherwise it closes once it reaches its cap, as PyTorch's DDP closes buckets. The first group of
// each kind has first_cap_bytes, later ones cap_bytes. Groups come in the order backward fills them.
std::vector<std::vector<size_t>> walk_by_size(const std::vector<torch::Tensor>& params, int64_t first_cap_bytes,
                                              int64_t cap_bytes, bool close_before_overflow) {
  struct Open {
    torch::ScalarType dtype;
    torch::Device device;
    std::vector<size_t> members;
    int64_t bytes = 0;
    int64_t cap = 0;
  };
  std::vector<Open> open;
  std::vector<std::vector<size_t>> closed;
  const auto close = [&](Open& o) {
    closed.push_back(std::move(o.members));
    o.members.clear();
    o.bytes = 0;
    o.cap = cap_bytes;
  };
  for (size_t k = params.size(); k-- > 0;) {
    const auto& p = params[k];
    auto it = std::find_if(open.begin(), open.end(),
                           [&](const Open& o) { return o.dtype == p.scalar_type() && o.device == p.device(); });
    if (it == open.end()) {
      open.push_back({p.scalar_type(), p.device(), {}, 0, first_cap_bytes});
      it = std::prev(open.end());
    }
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    if (close_before_overflow && !it->members.empty() && it->bytes + bytes > it->cap) close(*it);
    it->members.push_back(k);
    it->bytes += bytes;
    if (!close_before_overflow && it->bytes >= it->cap) close(*it);
  }
  for (auto& o : open) {
    if (!o.members.empty()) closed.push_back(std::move(o.members));
  }
  // Groups of different kinds interleave; order them by when backward should fill them.
  std::stable_sort(closed.begin(), closed.end(),
                   [](const std::vector<size_t>& a, const std::vector<size_t>& b) { return a.front() > b.front(); });
  return closed;
}

}  // namespace

int64_t megabytes_to_bytes(double mb) { return static_cast<int64_t>(mb * 1024.0 * 1024.0); }

std::vector<std::vector<size_t>> group_by_size(const std::vector<torch::Tensor>& params, int64_t cap_bytes) {
  auto groups = walk_by_size(params, cap_bytes, cap_bytes, /*close_before_overflow=*/true);
  // Within a group, registration order: the flat layout then reads like the model.
  for (auto& members : groups) std::sort(members.begin(), members.end());
  return groups;
}

UnitLayout unit_layout(models::Model& model, const std::vector<torch::Tensor>& params,
                       const std::optional<std::vector<int>>& wrap, const std::string& who) {
  std::map<const void*, size_t> index_of;
  for (size_t i = 0; i < params.size(); ++i) index_of[params[i].unsafeGetTensorImpl()] = i;
  const auto units = model.units();
  std::vector<int> wrap_of(units.size());
  if (wrap) {
    wrap_of = *wrap;
    check(wrap_of.size() == units.size(), who + ": the wrap policy answered for " + std::to_string(wrap_of.size()) +
                                              " units, the model has " + std::to_string(units.size()));
  } else {
    for (size_t u = 0; u < units.size(); ++u) wrap_of[u] = static_cast<int>(u);
  }
  // Parameters per wrapped unit (id -> members); units sharing an id must be neighbours.
  std::map<int, std::vector<size_t>> per_wrap;
  std::vector<bool> assigned(params.size(), false);
  for (size_t u = 0; u < units.size(); ++u) {
    const int id = wrap_of[u];
    if (id < 0) continue;
    check(!per_wrap.count(id) || (u > 0 && wrap_of[u - 1] == id),
          who + ": wrapped unit " + std::to_string(id) + " spans units that are not neighbours");
    auto& members = per_wrap[id];
    for (const auto& p : units[u].second->parameters()) {
      auto it = index_of.find(p.unsafeGetTensorImpl());
      if (it == index_of.end() || assigned[it->second]) continue;
      assigned[it->second] = true;
      members.push_back(it->second);
    }
  }
  std::vector<size_t> rest;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!assigned[i]) rest.push_back(i);
  }
  // Backward completes the last unit first; the root's parameters (outside every wrapped unit) last.
  UnitLayout layout;
  layout.unit_group.assign(units.size(), -1);
  std::map<int, int> group_of_wrap;
  for (size_t u = units.size(); u-- > 0;) {
    const int id = wrap_of[u];
    if (id < 0) continue;
    auto& members = per_wrap[id];
    if (members.empty()) continue;
    if (!group_of_wrap.count(id)) {
      group_of_wrap[id] = static_cast<int>(layout.groups.size());
      std::sort(members.begin(), members.end());
      layout.groups.push_back(members);
    }
    layout.unit_group[u] = group_of_wrap[id];
  }
  if (!rest.empty()) {
    layout.rest_group = static_cast<int>(layout.groups.size());
    layout.groups.push_back(rest);
  }
  // Backward runs the units in reverse: the group whose forward ran just before a group's comes next.
  layout.before.assign(layout.groups.size(), -1);
  int previous = -1;
  for (const int g : layout.unit_group) {
    if (g < 0 || g == previous) continue;
    layout.before[static_cast<size_t>(g)] = previous;
    previous = g;
  }
  return layout;
}

std::vector<std::vector<size_t>> ddp_buckets(const std::vector<torch::Tensor>& params, int64_t first_cap_bytes,
                                             int64_t cap_bytes) {
  return walk_by_size(params, first_cap_bytes, cap_bytes, /*close_before_overflow=*/false);
}

bool is_gradient_view(const torch::Tensor& grad, const torch::Tensor& view) {
  return grad.defined() && grad.data_ptr() == view.data_ptr() && grad.strides() == view.strides();
}

void bind_gradients_to_views(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& views) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    torch::Tensor param = params[i];
    auto& grad = param.mutable_grad();
    if (grad.defined()) views[i].copy_(grad);
    grad = views[i];
  }
}

std::vector<torch::Tensor> flatten_in_place(const std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const std::vector<size_t>& g) {
      const auto& first = tensors[g.front()];
      return first.scalar_type() == tensors[i].scalar_type() && first.device() == tensors[i].device();
    });
    if (it == groups.end()) {
      groups.push_back({i});
    } else {
      it->push_back(i);
    }
  }
  std::vector<torch::Tensor> flats;
  for (const auto& members : groups) {
    int64_t numel = 0;
    for (const size_t i : members) numel += tensors[i].numel();
    auto flat = torch::empty({numel}, tensors[members.front()].options());
    int64_t offset = 0;
    for (const size_t i : members) {
      torch::Tensor t = tensors[i];
      const auto place = flat.narrow(0, offset, t.numel()).view(t.sizes());
      place.copy_(t);
      t.set_(place);
      offset += t.numel();
    }
    flats.push_back(flat);
  }
  return flats;
}

torch::Tensor as_movable(const distributed::ProcessGroup& group, const torch::Tensor& t) {
  return t.scalar_type() == torch::kBFloat16 && !group.supports_bf16() ? t.view(torch::kHalf) : t;
}

torch::ScalarType reduction_dtype(const distributed::ProcessGroup& group, torch::ScalarType dtype) {
  return dtype == torch::kBFloat16 && !group.supports_bf16() ? torch::kFloat : dtype;
}

void check_and_broadcast(distributed::ProcessGroup& group, const std::vector<torch::Tensor>& params,
                         const std::vector<torch::Tensor>& buffers, const torch::Device& device, const std::string& who,
                         bool broadcast) {
  int64_t total = 0;
  int64_t shape_hash = 0;
  for (const auto& p : params) {
    total += p.numel();
    for (const auto d : p.sizes()) shape_hash = shape_hash * 31 + d + 1;
    shape_hash %= (int64_t{1} << 40);
  }
  const auto mine = torch::tensor({static_cast<int64_t>(params.size()), total, shape_hash}, torch::kLong);
  std::vector<torch::Tensor> everyone;
  group.all_gather(mine.to(group.needs_host_tensors() ? torch::Device(torch::kCPU) : device), &everyone).wait();
  for (size_t r = 0; r < everyone.size(); ++r) {
    check(torch::equal(everyone[r].cpu(), mine), who + ": rank " + std::to_string(r) +
                                                     " has a different model than rank " +
                                                     std::to_string(group.rank()) +
                                                     " (parameter count, sizes or shapes differ)");
  }
  if (!broadcast) return;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> state;
  for (const auto& p : params) state.push_back(as_movable(group, p));
  for (const auto& b : buffers) state.push_back(as_movable(group, b));
  if (!state.empty()) group.broadcast(state, 0).wait();
}

}  // namespace ptrain::strategies
