#include "ptrain/strategies/zero.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include "ptrain/core/error.h"
#include "ptrain/strategies/gradient_hooks.h"
#include "ptrain/strategies/gradient_reducer.h"
#include "ptrain/strategies/sharding.h"

namespace ptrain::strategies {

struct Zero::State {
  State(std::shared_ptr<distributed::ProcessGroup> g, torch::Device d, ZeroOptions o, ShardingPolicy p)
      : group(std::move(g)),
        device(d),
        options(std::move(o)),
        policy(p),
        streams(distributed::make_comm_streams(*group, device)),
        reducer({options.reduce_dtype, options.overlap_comm}, streams) {}

  std::shared_ptr<distributed::ProcessGroup> group;  // every rank
  ShardMesh mesh;                             // group, or its hybrid shard and replica parts
  torch::Device device;
  ZeroOptions options;
  ShardingPolicy policy;
  std::shared_ptr<distributed::CommStreams> streams;  // the reduce and gather streams beside the compute stream
  // One slot per group, in the order of groups.
  GradientReducer reducer;
  std::mutex mutex;

  std::vector<torch::Tensor> params;  // trainable parameters, in model order
  std::vector<std::string> names;
  std::vector<torch::Tensor> frozen;  // parameters that need no gradient: replicated, as they are
  std::vector<torch::Tensor> buffers;
  std::vector<torch::Tensor> buffer_flats;  // the buffers are views of these (one broadcast a flat)
  // In reduction order (the order backward should complete them).
  std::vector<std::unique_ptr<FlatParamGroup>> groups;
  std::vector<size_t> pending;        // per group, members whose gradient backward has not produced yet
  std::vector<size_t> members;        // per group, how many parameters it holds
  std::vector<int> before;            // per group, the one backward reaches next (-1: none; groups by units)
  std::vector<size_t> group_of;
  std::vector<bool> seen;             // this micro-step's backward produced the parameter's gradient
  std::vector<int> unit_group;        // groups by units: per model unit, its group or -1 (the root)
  int rest_group = -1;                // groups by units: parameters outside every unit (or all, without units)
  bool sync = true;
  bool prepared = false;
  GradientHooks hooks;

  int64_t world() const { return group->world_size(); }
  // Where collectives run: the device for NCCL, the CPU for gloo.
  torch::Device comm_device() const { return group->needs_host_tensors() ? torch::Device(torch::kCPU) : device; }

  void prefetch(int g) {
    if (g >= 0) groups[static_cast<size_t>(g)]->start_gather();
  }
  void release_all() {
    for (auto& g : groups) g->release();
  }
  void reset_pending() {
    std::fill(seen.begin(), seen.end(), false);
    pending = members;
  }

  void begin_micro_step() {
    std::lock_guard<std::mutex> lock(mutex);
    reset_pending();
    // An accumulation micro-step whose backward skipped some parameter leaves its group gathered.
    release_all();
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
    if (sync && pending[g] == members[g]) {
      // The group's first gradient this step: replicated gradients get their buffer now, and the next group's
      // with it, so that its gradients arrive in place (FlatParamGroup::bind_gradients).
      groups[g]->bind_gradients();
      if (g + 1 < groups.size()) groups[g + 1]->bind_gradients();
    }
    if (--pending[g] > 0) return;
    groups[g]->release();  // its backward is over: sharded parameters are freed
    if (options.backward_prefetch == Prefetch::backward_post) prefetch(before[g]);
    // The reducer launches the group's reduction (with overlap, once those before it are launched) and
    // waits for none.
    if (sync) reducer.mark_ready(g);
  }

  void finish() {
    std::lock_guard<std::mutex> lock(mutex);
    // Parameters that received no gradient contribute zeros (or what earlier micro-steps accumulated).
    // The one wait for the reductions: the host (gloo) or the compute stream (NCCL), before the optimizer.
    if (sync) reducer.finish();
    release_all();
    reset_pending();
  }
};

namespace {

ShardingPolicy policy_of(const StrategySpec& spec, const ZeroOptions& options) {
  auto policy = ShardingPolicy::of(spec);
  check(!options.offload_params || spec.can_offload_params(), "--offload-params needs --strategy zero3 (or fsdp)");
  check(options.hybrid_group_size == 0 || policy.hybrid, "zero: a hybrid group size needs a hybrid sharding");
  policy.offload_params = options.offload_params;
  policy.offload_optimizer = options.offload_optimizer;
  return policy;
}

}  // namespace

Zero::Zero(std::shared_ptr<distributed::ProcessGroup> group, torch::Device device, StrategySpec spec, ZeroOptions options)
    : options_(std::move(options)), spec_(spec) {
  check(group != nullptr, "zero: needs a process group");
  check(spec_.uses_flat_groups(), "zero: --strategy " + spec_.name() + " does not run on flat parameter groups");
  const auto policy = policy_of(spec_, options_);
  check(options_.reduce_bucket_mb > 0, "--reduce-bucket-mb must be positive");
  state_ = std::make_shared<State>(std::move(group), device, options_, policy);
}

Zero::~Zero() { state_->hooks.remove(); }

size_t Zero::groups_reduced() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->reducer.launched();
}

size_t Zero::group_count() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->groups.size();
}

size_t Zero::groups_holding_gradients() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return static_cast<size_t>(std::count_if(state_->groups.begin(), state_->groups.end(),
                                           [](const auto& g) { return g->holds_gradients(); }));
}

size_t Zero::reductions_completed() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->reducer.completed();
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
  s.buffer_flats = flatten_in_place(s.buffers);

  s.mesh = ShardMesh::of(s.group, s.policy.hybrid ? options_.hybrid_group_size : 0, name());

  // Groups, in the order backward should complete them.
  std::vector<std::vector<size_t>> layout;
  if (s.policy.groups_by_units()) {
    std::optional<std::vector<int>> wrap;
    if (options_.wrap) wrap = options_.wrap(model);
    auto units = unit_layout(model, s.params, wrap, name());
    layout = std::move(units.groups);
    s.unit_group = std::move(units.unit_group);
    s.rest_group = units.rest_group;
    s.before = std::move(units.before);
  } else {
    layout = group_by_size(s.params, megabytes_to_bytes(options_.reduce_bucket_mb));
    s.before.assign(layout.size(), -1);
  }

  s.group_of.assign(s.params.size(), 0);
  s.seen.assign(s.params.size(), false);
  torch::NoGradGuard no_grad;
  for (const auto& members : layout) {
    std::vector<torch::Tensor> params;
    std::vector<std::string> names;
    for (const size_t i : members) {
      s.group_of[i] = s.groups.size();
      params.push_back(s.params[i]);
      names.push_back(s.names[i]);
    }
    s.groups.push_back(std::make_unique<FlatParamGroup>(std::move(params), std::move(names), s.policy, s.mesh, s.device,
                                                        s.comm_device(), s.streams));
    s.reducer.add_slot(s.groups.back()->reduction());
    s.members.push_back(members.size());
  }
  s.pending = s.members;

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
  // At every world size, as ddp: one broadcast a flat buffer, in place.
  if (model.is_training() && options_.broadcast_buffers) sync_buffers();
  if (training) s.begin_micro_step();
  if (!s.policy.shards_parameters) return model.forward(inputs);

  // Gathers the group again when backward reaches the output of its forward, i.e. just before its
  // backward; backward prefetch "pre" then starts on the group backward reaches next.
  std::weak_ptr<State> weak = state_;
  const bool prefetch_pre = options_.backward_prefetch == Prefetch::backward_pre;
  auto gather_in_backward = [&](torch::Tensor& output, size_t g) {
    if (!training || !output.requires_grad()) return;
    output.register_hook([weak, g, prefetch_pre](const torch::Tensor&) {
      if (auto state = weak.lock()) {
        state->groups[g]->gather();
        if (prefetch_pre) state->prefetch(state->before[g]);
      }
    });
  };
  // Training keeps the root gathered from forward to backward, which needs it first.
  if (s.rest_group >= 0) s.groups[static_cast<size_t>(s.rest_group)]->gather();
  const size_t n = s.unit_group.size();
  // Around unit u's forward: its group is gathered before the group's first unit and, after its last,
  // arranged to be gathered again for backward and freed.
  const auto before_unit = [&](size_t u) {
    const int g = s.unit_group[u];
    if (g < 0 || (u > 0 && s.unit_group[u - 1] == g && s.groups[static_cast<size_t>(g)]->gathered())) return;
    s.groups[static_cast<size_t>(g)]->gather();
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
    if (!training || s.policy.reshards_after_forward) s.groups[static_cast<size_t>(g)]->release();
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
    if (!training) s.groups[static_cast<size_t>(s.rest_group)]->release();
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

void Zero::sync_buffers() {
  auto& s = *state_;
  check(s.prepared, name() + ": sync_buffers() before prepare()");
  if (s.buffer_flats.empty()) return;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> buffers;
  for (const auto& flat : s.buffer_flats) buffers.push_back(as_movable(*s.group, flat));
  s.group->broadcast(buffers, 0).wait();
}

torch::Tensor Zero::all_reduce_sum(torch::Tensor t) {
  std::vector<torch::Tensor> one{t};
  state_->group->all_reduce_sum(one).wait();
  return t;
}

std::string Zero::capture_obstacle() const {
  const auto& policy = state_->policy;
  if (!state_->group->stream_ordered()) return "--strategy " + name() + " over gloo waits for its collectives on the host";
  if (policy.offload_optimizer) return "--strategy " + name() + " steps its offloaded optimizer on the CPU";
  if (policy.offload_params) return "--strategy " + name() + " brings its offloaded parameter shards from the CPU";
  return "";
}

std::vector<std::string> Zero::all_gather_text(const std::string& name, const std::string& text) {
  return state_->group->all_gather_text(name, text);
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
      const bool offload = s.policy.offload_optimizer;
      const auto device = offload ? torch::Device(torch::kCPU) : s.device;
      const bool separate =
          master_weights || offload || dtype != source.scalar_type() || device != source.device();
      torch::Tensor opt = separate ? source.to(device, dtype, /*non_blocking=*/false, /*copy=*/true) : source.detach();
      if (separate && offload && s.device.is_cuda()) opt = opt.pin_memory();
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
    if (!s_->policy.shards_optimizer_state) return local_norm;  // every rank holds every gradient
    // Shards are disjoint (padding is zero): squares add up over one layout's ranks (hybrid replicas
    // hold the same shards).
    auto squared = local_norm.to(s_->comm_device(), torch::kFloat, false, /*copy=*/true).square();
    std::vector<torch::Tensor> one{squared};
    s_->mesh.shard->all_reduce_sum(one).wait();
    return squared.sqrt().to(local_norm.device());
  }

  void parameters_updated() override {
    auto& s = *s_;
    torch::NoGradGuard no_grad;
    for (size_t g = 0; g < params_.size(); ++g) {
      if (separate_[g]) param_shard(g).copy_(params_[g]);
      s.groups[g]->release_gradients();
    }
    if (!s.policy.gathers_after_step()) return;  // replicated; or gathered just in time, in forward
    for (auto& group : s.groups) group->gather_updated_parameters();
  }

  io::NamedTensors full_parameters() override {
    auto& s = *s_;
    std::map<std::string, torch::Tensor> by_name;
    for (size_t g = 0; g < params_.size(); ++g) {
      auto parts = s.groups[g]->gather_split(params_[g]);
      for (size_t i = 0; i < parts.size(); ++i) by_name[s.groups[g]->names()[i]] = parts[i];
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
      auto parts = s_->groups[g]->gather_split(tensor);
      const auto& names = s_->groups[g]->names();
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
      const auto& flat = s.groups[g]->flat();
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
      const auto& flat = s.groups[g]->flat();
      std::vector<torch::Tensor> per_param;
      for (const auto& name : flat.names()) {
        auto it = by_name.find(name);
        check(it != by_name.end(), source + ": parameter '" + name + "' is missing");
        per_param.push_back(it->second);
      }
      const auto joined = flat.join(per_param, per_param.front().options().device(torch::kCPU));
      s.groups[g]->load_full(joined);
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
      const auto& flat = s.groups[g]->flat();
      nlohmann::json group = {{"key", names_[g]},
                              {"numel", flat.numel()},
                              {"shard_numel", flat.shard_numel()},
                              {"shard_index", s.groups[g]->shard_index()},
                              {"shard_count", s.groups[g]->shard_count()},
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
      bytes.params += s.groups[g]->param_bytes();
      bytes.grads += s.groups[g]->grad_bytes();
      if (separate_[g]) bytes.optimizer += bytes_of(params_[g]) + bytes_of(grads_[g]);
    }
    for (const auto& [name, t] : optimizer_state) bytes.optimizer += bytes_of(t);
    return bytes;
  }

 private:
  torch::Tensor param_shard(size_t g) const { return s_->groups[g]->param_shard(); }
  torch::Tensor grad_shard(size_t g) const { return s_->groups[g]->grad_shard(); }

  // "zero.<g>.<slot>" -> g, slot.
  bool parse_key(const std::string& key, size_t* g, std::string* slot) const {
    if (key.rfind("zero.", 0) != 0) return false;
    const auto dot = key.find('.', 5);
    if (dot == std::string::npos) return false;
    *g = static_cast<size_t>(std::stoul(key.substr(5, dot - 5)));
    *slot = key.substr(dot + 1);
    return *g < s_->groups.size();
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
