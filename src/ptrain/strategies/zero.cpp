#include "ptrain/strategies/zero.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include "ptrain/core/error.h"
#include "ptrain/strategies/gradient_hooks.h"
#include "ptrain/strategies/sharding.h"

namespace ptrain::strategies {

struct Zero::State {
  struct Group {
    std::unique_ptr<FlatParams> flat;
    std::vector<size_t> members;  // indices into params
    size_t pending = 0;           // members whose gradient backward has not produced yet
    torch::Tensor grad_full;      // stage 1: the flat gradients, all-reduced
    torch::Tensor grad_shard;     // stages 2, 3: this rank's shard of the reduced gradients
    torch::Tensor param_shard;    // stage 3: this rank's shard of the parameters, kept between uses
    dist::Work work;
    dist::Work gather_work;       // stage 3: an all-gather in flight (prefetch)
    torch::Tensor gather_source;  // what it sends, alive until it is done
    int before = -1;              // stage 3: the group whose forward runs just before this one's (-1: none)
  };

  State(std::shared_ptr<dist::ProcessGroup> g, torch::Device d, ZeroOptions o)
      : group(std::move(g)), device(d), options(o) {}

  std::shared_ptr<dist::ProcessGroup> group;        // every rank
  std::shared_ptr<dist::ProcessGroup> shard_group;  // the ranks one shard layout spans: group, or a hybrid part
  std::shared_ptr<dist::ProcessGroup> replica_group;  // hybrid: the ranks holding this rank's shard; else null
  torch::Device device;
  ZeroOptions options;
  std::mutex mutex;

  std::vector<torch::Tensor> params;  // trainable parameters, in model order
  std::vector<std::string> names;
  std::vector<torch::Tensor> frozen;  // parameters that need no gradient: replicated, as they are
  std::vector<torch::Tensor> buffers;
  std::vector<Group> groups;          // in reduction order (the order backward should complete them)
  std::vector<size_t> group_of;
  std::vector<bool> seen;             // this micro-step's backward produced the parameter's gradient
  std::vector<int> unit_group;        // stage 3: per model unit, its group or -1 (the root)
  int rest_group = -1;                // stage 3: parameters outside every unit (or all, without units)
  size_t next_to_reduce = 0;
  bool sync = true;
  bool prepared = false;
  GradientHooks hooks;

  int stage() const { return options.stage; }
  int64_t world() const { return group->world_size(); }
  // Where collectives run: the device for NCCL, the CPU for gloo.
  torch::Device comm_device() const { return group->needs_host_tensors() ? torch::Device(torch::kCPU) : device; }

  // Stage 3: starts gathering the group's parameters whole from every rank's shard, unless they are
  // gathered or on their way.
  void start_gather(size_t g) {
    auto& group_ = groups[g];
    if (group_.flat->allocated()) return;
    group_.flat->regrow();
    torch::NoGradGuard no_grad;
    group_.gather_source = as_movable(*shard_group, group_.param_shard.to(device));
    group_.gather_work = shard_group->all_gather_into_async(as_movable(*shard_group, group_.flat->full()), group_.gather_source);
  }
  // ... and waits until they are there.
  void gather(size_t g) {
    start_gather(g);
    groups[g].gather_work.wait();
    groups[g].gather_source = torch::Tensor();
  }
  void prefetch(int g) {
    if (g >= 0) start_gather(static_cast<size_t>(g));
  }
  void release(size_t g) {
    if (stage() != 3) return;
    groups[g].gather_work.wait();
    groups[g].gather_source = torch::Tensor();
    groups[g].flat->free();
  }
  void release_all() {
    for (size_t g = 0; g < groups.size(); ++g) release(g);
  }

  void begin_micro_step() {
    std::lock_guard<std::mutex> lock(mutex);
    std::fill(seen.begin(), seen.end(), false);
    for (auto& g : groups) g.pending = g.members.size();
    next_to_reduce = 0;
    // An accumulation micro-step whose backward skipped some parameter leaves its group gathered.
    if (stage() == 3) release_all();
  }

  // Caller holds mutex. Groups are reduced strictly in order, so every rank issues the same collectives
  // whatever order its hooks fired in.
  void reduce_complete_groups_locked() {
    while (next_to_reduce < groups.size() && groups[next_to_reduce].pending == 0) {
      auto& g = groups[next_to_reduce++];
      torch::NoGradGuard no_grad;
      auto flat = g.flat->flat_grads(1.0 / static_cast<double>(world()));
      for (const size_t i : g.members) params[i].mutable_grad().reset();
      // --reduce-dtype: the gradients are rounded to it, summed in it and the sum rounded to it. gloo sums
      // no bfloat16: there the bfloat16 values are summed in float32 and the sum rounded to bfloat16 once
      // (for two ranks exactly what a bfloat16 sum gives).
      const auto wire = options.reduce_dtype.value_or(flat.scalar_type());
      const auto travel = reduction_dtype(*group, wire);
      if (wire != flat.scalar_type() || travel != flat.scalar_type()) {
        auto converted = flat.to(wire).to(travel);
        if (stage() <= 1) {
          std::vector<torch::Tensor> one{converted};
          group->all_reduce_sum(one).wait();
          g.grad_full = converted.to(wire).to(flat.scalar_type());
        } else {
          auto shard = torch::empty({g.flat->shard_numel()}, converted.options());
          shard_group->reduce_scatter_sum(shard, converted);
          reduce_across_replicas(shard);
          g.grad_shard.copy_(shard.to(wire));
        }
      } else if (stage() <= 1) {
        g.grad_full = flat;
        std::vector<torch::Tensor> one{g.grad_full};
        g.work = group->all_reduce_sum(one);
      } else {
        shard_group->reduce_scatter_sum(g.grad_shard, flat);
        reduce_across_replicas(g.grad_shard);
      }
    }
  }

  // Hybrid sharding: every replica reduced its own part of the batch into its shard; the replicas of a
  // shard sum theirs.
  void reduce_across_replicas(const torch::Tensor& shard) {
    if (!replica_group) return;
    std::vector<torch::Tensor> one{shard};
    replica_group->all_reduce_sum(one).wait();
  }

  void on_gradient(size_t index) {
    std::lock_guard<std::mutex> lock(mutex);
    if (sync) {
      check(!seen[index], "zero: parameter '" + names[index] +
                              "' received its gradient twice in one synchronised step (several backward calls "
                              "before finish_backward, or a parameter used twice?)");
    }
    if (seen[index]) return;
    seen[index] = true;
    const size_t g = group_of[index];
    if (--groups[g].pending > 0) return;
    release(g);  // its backward is over: stage 3 frees the gathered parameters
    if (stage() == 3 && options.backward_prefetch == Prefetch::backward_post) prefetch(groups[g].before);
    if (sync && options.overlap_comm) reduce_complete_groups_locked();
  }

  void finish() {
    std::lock_guard<std::mutex> lock(mutex);
    if (sync) {
      // Parameters that received no gradient contribute zeros (or what earlier micro-steps accumulated).
      for (auto& g : groups) g.pending = 0;
      reduce_complete_groups_locked();
      for (auto& g : groups) g.work.wait();
    }
    release_all();
    std::fill(seen.begin(), seen.end(), false);
    for (auto& g : groups) g.pending = g.members.size();
    next_to_reduce = 0;
  }
};

Zero::Zero(std::shared_ptr<dist::ProcessGroup> group, torch::Device device, ZeroOptions options)
    : options_(options) {
  check(group != nullptr, "zero: needs a process group");
  check(options_.stage >= 0 && options_.stage <= 3, "zero: stage must be 0, 1, 2 or 3");
  check(!options_.offload_params || options_.stage == 3, "--offload-params needs --strategy zero3 (or fsdp)");
  check(options_.shard_group_size == 0 || options_.stage == 3, "zero: hybrid sharding needs stage 3");
  check(options_.reduce_bucket_mb > 0, "--reduce-bucket-mb must be positive");
  state_ = std::make_shared<State>(std::move(group), device, options_);
}

Zero::~Zero() { state_->hooks.remove(); }

size_t Zero::groups_reduced() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->next_to_reduce;
}

int64_t Zero::rank() const { return state_->group->rank(); }
int64_t Zero::world_size() const { return state_->group->world_size(); }

void Zero::prepare(models::Model& model) {
  auto& s = *state_;
  check(!s.prepared, name() + ": prepare() called twice");
  s.prepared = true;
  std::vector<torch::Tensor> all;
  for (const auto& item : model.named_parameters()) {
    all.push_back(item.value());
    if (item.value().requires_grad()) {
      s.params.push_back(item.value());
      s.names.push_back(item.key());
    } else {
      s.frozen.push_back(item.value());
    }
  }
  check(!s.params.empty(), name() + ": the model has no trainable parameters");
  for (const auto& b : model.buffers()) s.buffers.push_back(b);
  check_and_broadcast(*s.group, all, s.buffers, s.device, name(), options_.sync_module_states);

  s.shard_group = s.group;
  if (options_.shard_group_size > 0 && options_.shard_group_size < world_size()) {
    const int64_t size = options_.shard_group_size;
    check(world_size() % size == 0, name() + ": hybrid sharding in groups of " + std::to_string(size) +
                                        " ranks needs a world size divisible by it, not " + std::to_string(world_size()));
    std::vector<int64_t> shard_ranks, replica_ranks;
    for (int64_t r = 0; r < size; ++r) shard_ranks.push_back(rank() / size * size + r);
    for (int64_t r = rank() % size; r < world_size(); r += size) replica_ranks.push_back(r);
    s.shard_group = s.group->subgroup(shard_ranks, "shard" + std::to_string(rank() / size));
    s.replica_group = s.group->subgroup(replica_ranks, "replica" + std::to_string(rank() % size));
  }

  // Groups, in the order backward should complete them.
  std::vector<std::vector<size_t>> layout;
  if (s.stage() < 3) {
    layout = group_by_size(s.params, megabytes_to_bytes(options_.reduce_bucket_mb));
  } else {
    std::map<const void*, size_t> index_of;
    for (size_t i = 0; i < s.params.size(); ++i) index_of[s.params[i].unsafeGetTensorImpl()] = i;
    const auto units = model.units();
    std::vector<int> wrap_of(units.size());
    if (options_.wrap) {
      wrap_of = options_.wrap(model);
      check(wrap_of.size() == units.size(), name() + ": the wrap policy answered for " + std::to_string(wrap_of.size()) +
                                                " units, the model has " + std::to_string(units.size()));
    } else {
      for (size_t u = 0; u < units.size(); ++u) wrap_of[u] = static_cast<int>(u);
    }
    // Parameters per wrapped unit (id -> members); units sharing an id must be neighbours.
    std::map<int, std::vector<size_t>> per_wrap;
    std::vector<bool> assigned(s.params.size(), false);
    for (size_t u = 0; u < units.size(); ++u) {
      const int id = wrap_of[u];
      if (id < 0) continue;
      check(!per_wrap.count(id) || (u > 0 && wrap_of[u - 1] == id),
            name() + ": wrapped unit " + std::to_string(id) + " spans units that are not neighbours");
      auto& members = per_wrap[id];
      for (const auto& p : units[u].second->parameters()) {
        auto it = index_of.find(p.unsafeGetTensorImpl());
        if (it == index_of.end() || assigned[it->second]) continue;
        assigned[it->second] = true;
        members.push_back(it->second);
      }
    }
    std::vector<size_t> rest;
    for (size_t i = 0; i < s.params.size(); ++i) {
      if (!assigned[i]) rest.push_back(i);
    }
    // Backward completes the last unit first; the root's parameters (outside every wrapped unit) last.
    s.unit_group.assign(units.size(), -1);
    std::map<int, int> group_of_wrap;
    for (size_t u = units.size(); u-- > 0;) {
      const int id = wrap_of[u];
      if (id < 0) continue;
      auto& members = per_wrap[id];
      if (members.empty()) continue;
      if (!group_of_wrap.count(id)) {
        group_of_wrap[id] = static_cast<int>(layout.size());
        std::sort(members.begin(), members.end());
        layout.push_back(members);
      }
      s.unit_group[u] = group_of_wrap[id];
    }
    if (!rest.empty()) {
      s.rest_group = static_cast<int>(layout.size());
      layout.push_back(rest);
    }
  }

  s.group_of.assign(s.params.size(), 0);
  s.seen.assign(s.params.size(), false);
  torch::NoGradGuard no_grad;
  for (auto& members : layout) {
    State::Group g;
    std::vector<torch::Tensor> params;
    std::vector<std::string> names;
    for (const size_t i : members) {
      s.group_of[i] = s.groups.size();
      params.push_back(s.params[i]);
      names.push_back(s.names[i]);
    }
    // Stage 0 replicates: a layout of one shard, the whole group.
    g.flat = s.stage() == 0 ? std::make_unique<FlatParams>(params, names, 0, 1)
                            : std::make_unique<FlatParams>(params, names, s.shard_group->rank(), s.shard_group->world_size());
    g.members = members;
    g.pending = members.size();
    const auto options = g.flat->full().options();
    if (s.stage() <= 1) {
      g.grad_full = torch::zeros({g.flat->padded_numel()}, options);
    } else {
      g.grad_shard = torch::zeros({g.flat->shard_numel()}, options);
    }
    if (s.stage() == 3) {
      g.param_shard = g.flat->shard().clone();
      if (options_.offload_params) {
        g.param_shard = g.param_shard.to(torch::kCPU);
        if (s.device.is_cuda()) g.param_shard = g.param_shard.pin_memory();
      }
      g.flat->free();
    }
    s.groups.push_back(std::move(g));
  }
  // Backward runs the units in reverse: the group whose forward ran just before a group's comes next.
  int previous = -1;
  for (const int g : s.unit_group) {
    if (g < 0 || g == previous) continue;
    s.groups[static_cast<size_t>(g)].before = previous;
    previous = g;
  }

  std::weak_ptr<State> weak = state_;
  s.hooks.install(
      s.params,
      [weak](size_t i) {
        if (auto state = weak.lock()) state->on_gradient(i);
      },
      [&](size_t i) { return name() + ": parameter '" + s.names[i] + "'"; });
}

torch::Tensor Zero::forward(models::Model& model, const torch::Tensor& inputs) {
  auto& s = *state_;
  check(s.prepared, name() + ": forward() before prepare()");
  const bool training = model.is_training() && torch::GradMode::is_enabled();
  if (model.is_training() && options_.broadcast_buffers && world_size() > 1 && !s.buffers.empty()) {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> buffers;
    for (const auto& b : s.buffers) buffers.push_back(as_movable(*s.group, b));
    s.group->broadcast(buffers, 0);
  }
  if (training) s.begin_micro_step();
  if (s.stage() < 3) return model.forward(inputs);

  // Gathers the group again when backward reaches the output of its forward, i.e. just before its
  // backward; backward prefetch "pre" then starts on the group backward reaches next.
  std::weak_ptr<State> weak = state_;
  const bool prefetch_pre = options_.backward_prefetch == Prefetch::backward_pre;
  auto gather_in_backward = [&](torch::Tensor& output, size_t g) {
    if (!training || !output.requires_grad()) return;
    output.register_hook([weak, g, prefetch_pre](const torch::Tensor&) {
      if (auto state = weak.lock()) {
        state->gather(g);
        if (prefetch_pre) state->prefetch(state->groups[g].before);
      }
    });
  };
  // Training keeps the root gathered from forward to backward, which needs it first.
  if (s.rest_group >= 0) s.gather(static_cast<size_t>(s.rest_group));
  const size_t n = s.unit_group.size();
  // Around unit u's forward: its group is gathered before the group's first unit and, after its last,
  // arranged to be gathered again for backward and freed.
  const auto before_unit = [&](size_t u) {
    const int g = s.unit_group[u];
    if (g < 0 || (u > 0 && s.unit_group[u - 1] == g && s.groups[static_cast<size_t>(g)].flat->allocated())) return;
    s.gather(static_cast<size_t>(g));
    if (options_.forward_prefetch) {
      for (size_t next = u + 1; next < n; ++next) {
        if (s.unit_group[next] >= 0 && s.unit_group[next] != g) {
          s.prefetch(s.unit_group[next]);
          break;
        }
      }
    }
  };
  const auto after_unit = [&](size_t u, torch::Tensor& out) {
    const int g = s.unit_group[u];
    if (g < 0 || (u + 1 < n && s.unit_group[u + 1] == g)) return;
    gather_in_backward(out, static_cast<size_t>(g));
    if (!training || options_.reshard_after_forward) s.release(static_cast<size_t>(g));
  };
  torch::Tensor x = inputs;
  if (s.unit_group.empty()) {
    x = model.forward(x);
  } else if (model.units_run_themselves()) {
    // The model calls its units where its forward needs them and tells us.
    struct Observer final : models::UnitObserver {
      std::function<void(size_t)> before;
      std::function<void(size_t, torch::Tensor&)> after;
      void before_unit(size_t u) override { before(u); }
      void after_unit(size_t u, torch::Tensor& out) override { after(u, out); }
    } observer;
    observer.before = before_unit;
    observer.after = after_unit;
    model.observe_units(&observer);
    try {
      x = model.forward(x);
    } catch (...) {
      model.observe_units(nullptr);
      throw;
    }
    model.observe_units(nullptr);
  } else {
    for (size_t u = 0; u < n; ++u) {
      before_unit(u);
      x = model.forward_unit(u, x);
      after_unit(u, x);
    }
  }
  if (s.rest_group >= 0) {
    gather_in_backward(x, static_cast<size_t>(s.rest_group));
    if (!training) s.release(static_cast<size_t>(s.rest_group));
  }
  return x;
}

void Zero::set_gradient_sync(bool enabled) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->sync = enabled;
}

void Zero::finish_backward() {
  check(state_->prepared, name() + ": finish_backward() before prepare()");
  state_->finish();
}

torch::Tensor Zero::all_reduce_sum(torch::Tensor t) {
  std::vector<torch::Tensor> one{t};
  state_->group->all_reduce_sum(one).wait();
  return t;
}

namespace {

// The optimizer steps one flat shard per group: the parameters' own shard when it has the optimizer's
// dtype and device, else a copy (fp32 masters, or the CPU copy of --offload-optimizer).
class ZeroTarget final : public UpdateTarget {
 public:
  ZeroTarget(std::shared_ptr<Zero::State> state, bool master_weights) : s_(std::move(state)) {
    auto& s = *s_;
    torch::NoGradGuard no_grad;
    for (size_t g = 0; g < s.groups.size(); ++g) {
      const auto source = param_shard(g);
      const auto dtype = master_weights ? torch::kFloat : source.scalar_type();
      const auto device = s.options.offload_optimizer ? torch::Device(torch::kCPU) : s.device;
      const bool separate = master_weights || s.options.offload_optimizer || dtype != source.scalar_type() ||
                            device != source.device();
      torch::Tensor opt = separate ? source.to(device, dtype, /*non_blocking=*/false, /*copy=*/true) : source.detach();
      if (separate && s.options.offload_optimizer && s.device.is_cuda()) opt = opt.pin_memory();
      params_.push_back(opt);
      separate_.push_back(separate);
      grads_.push_back(separate ? torch::zeros_like(opt) : torch::Tensor());
      names_.push_back("zero." + std::to_string(g));
    }
  }

  const std::vector<torch::Tensor>& params() const override { return params_; }
  const std::vector<std::string>& names() const override { return names_; }

  void gradients_ready() override {
    torch::NoGradGuard no_grad;
    for (size_t g = 0; g < params_.size(); ++g) {
      auto reduced = grad_shard(g);
      if (separate_[g]) {
        grads_[g].copy_(reduced);
        params_[g].mutable_grad() = grads_[g];
      } else {
        params_[g].mutable_grad() = reduced;
      }
    }
  }

  void agree_found_inf(const torch::Tensor& found_inf) override {
    auto t = found_inf.to(s_->comm_device(), torch::kFloat, false, /*copy=*/true);
    std::vector<torch::Tensor> one{t};
    s_->group->all_reduce_sum(one).wait();
    found_inf.copy_(t.clamp_max(1.0));
  }

  torch::Tensor global_norm(const torch::Tensor& local_norm) override {
    if (s_->stage() == 0) return local_norm;  // every rank holds every gradient
    // Shards are disjoint (padding is zero): squares add up over one layout's ranks (hybrid replicas
    // hold the same shards).
    auto squared = local_norm.to(s_->comm_device(), torch::kFloat, false, /*copy=*/true).square();
    std::vector<torch::Tensor> one{squared};
    s_->shard_group->all_reduce_sum(one).wait();
    return squared.sqrt().to(local_norm.device());
  }

  void parameters_updated() override {
    auto& s = *s_;
    torch::NoGradGuard no_grad;
    for (size_t g = 0; g < params_.size(); ++g) {
      if (separate_[g]) param_shard(g).copy_(params_[g]);
    }
    if (s.stage() == 0 || s.stage() == 3) return;  // replicated; or gathered just in time, in forward
    for (auto& group : s.groups) {
      auto shard = group.flat->shard().clone();
      s.shard_group->all_gather_into(as_movable(*s.shard_group, group.flat->full()), as_movable(*s.shard_group, shard));
    }
  }

  io::NamedTensors full_parameters() override {
    auto& s = *s_;
    std::map<std::string, torch::Tensor> by_name;
    for (size_t g = 0; g < params_.size(); ++g) {
      auto parts = gather_split(g, params_[g]);
      for (size_t i = 0; i < parts.size(); ++i) by_name[s.groups[g].flat->names()[i]] = parts[i];
    }
    io::NamedTensors out;
    for (const auto& name : s.names) out.emplace_back(name, by_name.at(name));
    return out;
  }

  io::NamedTensors full_optimizer_state(const io::NamedTensors& state) override {
    io::NamedTensors out;
    for (const auto& [key, tensor] : state) {
      size_t g = 0;
      std::string slot;
      if (!parse_key(key, &g, &slot)) {
        out.emplace_back(key, tensor);
        continue;
      }
      auto parts = gather_split(g, tensor);
      const auto& names = s_->groups[g].flat->names();
      for (size_t i = 0; i < parts.size(); ++i) out.emplace_back(names[i] + "." + slot, parts[i]);
    }
    return out;
  }

  io::NamedTensors local_optimizer_state(const io::NamedTensors& full) override {
    auto& s = *s_;
    std::map<std::string, size_t> param_index;
    for (size_t i = 0; i < s.names.size(); ++i) param_index[s.names[i]] = i;
    std::map<std::string, torch::Tensor> by_name;
    std::vector<std::set<std::string>> slots(s.groups.size());
    io::NamedTensors out;
    for (const auto& [key, tensor] : full) {
      const auto dot = key.rfind('.');
      auto it = dot == std::string::npos ? param_index.end() : param_index.find(key.substr(0, dot));
      if (it == param_index.end()) {
        out.emplace_back(key, tensor);
        continue;
      }
      slots[s.group_of[it->second]].insert(key.substr(dot + 1));
      by_name[key] = tensor;
    }
    for (size_t g = 0; g < s.groups.size(); ++g) {
      const auto& flat = *s.groups[g].flat;
      for (const auto& slot : slots[g]) {
        std::vector<torch::Tensor> per_param;
        for (const auto& name : flat.names()) {
          auto it = by_name.find(name + "." + slot);
          check(it != by_name.end(), "optimizer state '" + name + "." + slot + "' is missing");
          per_param.push_back(it->second);
        }
        auto joined = flat.join(per_param, per_param.front().options().device(torch::kCPU));
        out.emplace_back(names_[g] + "." + slot, flat.shard_of(joined).clone());
      }
    }
    return out;
  }

  void load_full_parameters(const io::NamedTensors& full, const std::string& source) override {
    auto& s = *s_;
    std::map<std::string, torch::Tensor> by_name(full.begin(), full.end());
    torch::NoGradGuard no_grad;
    for (size_t g = 0; g < s.groups.size(); ++g) {
      const auto& flat = *s.groups[g].flat;
      std::vector<torch::Tensor> per_param;
      for (const auto& name : flat.names()) {
        auto it = by_name.find(name);
        check(it != by_name.end(), source + ": parameter '" + name + "' is missing");
        per_param.push_back(it->second);
      }
      const auto joined = flat.join(per_param, per_param.front().options().device(torch::kCPU));
      if (s.stage() < 3) {
        flat.full().copy_(joined);
      } else {
        s.groups[g].param_shard.copy_(flat.shard_of(joined));
      }
      if (separate_[g]) params_[g].copy_(flat.shard_of(joined));
    }
  }

  // The layout, per group: {"key", "numel", "shard_numel", "shard_index", "shard_count", "params": [{"name",
  // "shape", "offset"}]}; the parameters' shards are the optimizer's (fp32 masters where there are any).
  io::NamedTensors local_shards(const io::NamedTensors& optimizer_state, nlohmann::json* layout) override {
    auto& s = *s_;
    io::NamedTensors out;
    *layout = nlohmann::json::array();
    for (size_t g = 0; g < params_.size(); ++g) {
      const auto& flat = *s.groups[g].flat;
      nlohmann::json group = {{"key", names_[g]},
                              {"numel", flat.numel()},
                              {"shard_numel", flat.shard_numel()},
                              {"shard_index", s.stage() == 0 ? 0 : s.shard_group->rank()},
                              {"shard_count", s.stage() == 0 ? 1 : s.shard_group->world_size()},
                              {"params", nlohmann::json::array()}};
      for (size_t i = 0; i < flat.names().size(); ++i) {
        group["params"].push_back(
            {{"name", flat.names()[i]}, {"shape", flat.params()[i].sizes().vec()}, {"offset", flat.offset(i)}});
      }
      layout->push_back(group);
      out.emplace_back(names_[g], params_[g].detach().to(torch::kCPU));
    }
    for (const auto& [key, tensor] : optimizer_state) out.emplace_back(key, tensor.to(torch::kCPU));
    return out;
  }

  ModelStateBytes model_state_bytes(const io::NamedTensors& optimizer_state) const override {
    const auto& s = *s_;
    ModelStateBytes bytes;
    for (const auto& p : s.frozen) bytes.params += bytes_of(p);
    for (size_t g = 0; g < s.groups.size(); ++g) {
      const auto& group = s.groups[g];
      bytes.params += s.stage() == 3 ? bytes_of(group.param_shard) : bytes_of(group.flat->full());
      bytes.grads += s.stage() <= 1 ? bytes_of(group.grad_full) : bytes_of(group.grad_shard);
      if (separate_[g]) bytes.optimizer += bytes_of(params_[g]) + bytes_of(grads_[g]);
    }
    for (const auto& [name, t] : optimizer_state) bytes.optimizer += bytes_of(t);
    return bytes;
  }

 private:
  torch::Tensor param_shard(size_t g) const {
    const auto& group = s_->groups[g];
    return s_->stage() == 3 ? group.param_shard : group.flat->shard();
  }
  torch::Tensor grad_shard(size_t g) const {
    const auto& group = s_->groups[g];
    return s_->stage() <= 1 ? group.flat->shard_of(group.grad_full) : group.grad_shard;
  }

  // "zero.<g>.<slot>" -> g, slot.
  bool parse_key(const std::string& key, size_t* g, std::string* slot) const {
    if (key.rfind("zero.", 0) != 0) return false;
    const auto dot = key.find('.', 5);
    if (dot == std::string::npos) return false;
    *g = static_cast<size_t>(std::stoul(key.substr(5, dot - 5)));
    *slot = key.substr(dot + 1);
    return *g < s_->groups.size();
  }

  // Every rank's shard of a tensor of group g's layout, as full per-parameter tensors on the CPU.
  std::vector<torch::Tensor> gather_split(size_t g, const torch::Tensor& shard) {
    const auto& flat = *s_->groups[g].flat;
    std::vector<torch::Tensor> out;
    if (s_->stage() == 0) {
      for (const auto& part : flat.split(shard)) out.push_back(part.to(torch::kCPU).clone());
      return out;
    }
    auto& shards = *s_->shard_group;
    auto whole = torch::empty({flat.padded_numel()}, shard.options().device(s_->comm_device()));
    shards.all_gather_into(as_movable(shards, whole), as_movable(shards, shard.to(s_->comm_device())));
    for (const auto& part : flat.split(whole)) out.push_back(part.to(torch::kCPU).clone());
    return out;
  }

  std::shared_ptr<Zero::State> s_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<bool> separate_;
  std::vector<torch::Tensor> grads_;
};

}  // namespace

std::unique_ptr<UpdateTarget> Zero::update_target(models::Model&, bool master_weights) {
  check(state_->prepared, name() + ": update_target() before prepare()");
  return std::make_unique<ZeroTarget>(state_, master_weights);
}

}  // namespace ptrain::strategies
