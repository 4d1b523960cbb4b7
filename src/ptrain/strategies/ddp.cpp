#include "ptrain/strategies/ddp.h"

#include <algorithm>
#include <mutex>

#include "ptrain/core/error.h"
#include "ptrain/strategies/gradient_hooks.h"
#include "ptrain/strategies/gradient_reducer.h"
#include "ptrain/strategies/sharding.h"

namespace ptrain::strategies {

// DDP's buckets over the one GradientReducer: the hooks count each bucket's gradients, a full bucket is
// marked ready (launched in bucket order), and finish() copies the averages back into .grad.
struct DistributedDataParallel::Reducer {
  struct Bucket {
    torch::Tensor flat;
    std::vector<size_t> params;
    std::vector<int64_t> offsets;
    size_t pending = 0;
  };

  Reducer(std::shared_ptr<dist::ProcessGroup> g, const DdpOptions& o, torch::Device device)
      : group(std::move(g)),
        streams(dist::make_comm_streams(*group, device)),
        reducer({o.reduce_dtype, o.overlap}, streams) {}

  std::shared_ptr<dist::ProcessGroup> group;
  std::shared_ptr<dist::CommStreams> streams;
  GradientReducer reducer;  // one slot per bucket, in bucket order
  std::mutex mutex;
  std::vector<torch::Tensor> params;
  std::vector<size_t> bucket_of;
  std::vector<size_t> slot_of;  // position inside its bucket
  std::vector<bool> ready;
  std::vector<Bucket> buckets;
  bool sync = true;
  GradientHooks hooks;

  // Parameter index's place in its bucket, with the parameter's shape and (where its memory is dense) its strides:
  // the gradient layout fused optimizers and autograd's in-place accumulation expect.
  torch::Tensor view_of(size_t index) {
    const auto& bucket = buckets[bucket_of[index]];
    const auto& param = params[index];
    const int64_t offset = bucket.offsets[slot_of[index]];
    if (param.is_non_overlapping_and_dense())
      return bucket.flat.as_strided(param.sizes(), param.strides(), bucket.flat.storage_offset() + offset);
    return bucket.flat.narrow(0, offset, param.numel()).view(param.sizes());
  }

  // Gradients live in their buckets, as PyTorch DDP's gradient_as_bucket_view: before a step's first backward every
  // parameter without a gradient gets its bucket view, zeroed, so that autograd accumulates into the bucket in
  // place, the all-reduce averages it there and the optimizer reads it there. No copy in or out, and no gradient
  // memory beside the buckets. A gradient that is not its view (set by someone else) is copied in and out instead.
  void bind_gradients() {
    std::lock_guard<std::mutex> lock(mutex);
    torch::NoGradGuard no_grad;
    for (auto& bucket : buckets) {
      const bool none_bound = std::none_of(bucket.params.begin(), bucket.params.end(),
                                           [&](size_t index) { return params[index].grad().defined(); });
      if (none_bound) bucket.flat.zero_();
      for (const size_t index : bucket.params) {
        auto& grad = params[index].mutable_grad();
        if (grad.defined()) continue;
        grad = view_of(index);
        if (!none_bound) grad.zero_();
      }
    }
  }

  // The bucket's gradients into its flat buffer (zeros for parameters without one), when it launches.
  torch::Tensor fill(size_t b, std::vector<torch::Tensor>* hold) {
    for (const size_t index : buckets[b].params) {
      auto view = view_of(index);
      const auto& grad = params[index].grad();
      if (is_gradient_view(grad, view)) continue;
      if (grad.defined()) {
        view.copy_(grad);
        hold->push_back(grad);
      } else {
        view.zero_();
      }
    }
    return buckets[b].flat;
  }

  // Caller holds mutex.
  void mark_ready_locked(size_t index) {
    check(!ready[index], "ddp: parameter " + std::to_string(index) +
                             " received its gradient twice in one synchronised step (several backward calls "
                             "before finish_backward?)");
    ready[index] = true;
    const size_t b = bucket_of[index];
    if (--buckets[b].pending == 0) reducer.mark_ready(b);
  }

  void on_gradient_accumulated(size_t index) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!sync) return;
    mark_ready_locked(index);
  }

  void finish() {
    std::lock_guard<std::mutex> lock(mutex);
    if (!sync) return;
    // The one wait for the reductions: the host (gloo) or the compute stream (NCCL).
    reducer.finish();
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      auto view = view_of(i);
      auto& grad = params[i].mutable_grad();
      if (!grad.defined()) {
        grad = view;
      } else if (!is_gradient_view(grad, view)) {
        grad.copy_(view);
      }
      ready[i] = false;
    }
    for (auto& bucket : buckets) bucket.pending = bucket.params.size();
  }
};

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<dist::ProcessGroup> group, torch::Device device,
                                                 DdpOptions options)
    : group_(std::move(group)), device_(device), options_(options) {
  check(group_ != nullptr, "ddp: needs a process group");
  check(options_.bucket_cap_mb > 0, "--bucket-cap-mb must be positive");
  check(options_.first_bucket_mb > 0, "ddp: the first bucket size must be positive");
}

DistributedDataParallel::~DistributedDataParallel() {
  if (reducer_) reducer_->hooks.remove();
}

void DistributedDataParallel::prepare(models::Model& model) {
  check(reducer_ == nullptr, "ddp: prepare() called twice");
  if (options_.sync_batchnorm) sync_norms_ = convert_sync_batchnorm(model, group_);

  std::vector<torch::Tensor> params;
  for (const auto& p : model.parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  // Ranks that built different models would exchange garbage: shapes are compared first. bfloat16 moves
  // over gloo as the same bits viewed as float16.
  std::vector<torch::Tensor> buffers;
  for (const auto& b : model.buffers()) buffers.push_back(b);
  check_and_broadcast(*group_, params, buffers, device_, "ddp");
  buffer_flats_ = flatten_in_place(buffers);

  reducer_ = std::make_shared<Reducer>(group_, options_, device_);
  auto& r = *reducer_;
  r.params = params;
  r.bucket_of.assign(params.size(), 0);
  r.slot_of.assign(params.size(), 0);
  r.ready.assign(params.size(), false);

  auto closed = ddp_buckets(params, megabytes_to_bytes(options_.first_bucket_mb),
                            megabytes_to_bytes(options_.bucket_cap_mb));
  for (auto& members : closed) {
    Reducer::Bucket bucket;
    int64_t numel = 0;
    for (size_t slot = 0; slot < members.size(); ++slot) {
      r.bucket_of[members[slot]] = r.buckets.size();
      r.slot_of[members[slot]] = slot;
      bucket.offsets.push_back(numel);
      numel += params[members[slot]].numel();
    }
    bucket.flat = torch::zeros({numel}, params[members.front()].options().requires_grad(false));
    bucket.pending = members.size();
    bucket.params = std::move(members);
    r.buckets.push_back(std::move(bucket));
  }
  for (size_t b = 0; b < r.buckets.size(); ++b) {
    ReductionSlot slot;
    slot.all = group_;
    slot.output = r.buckets[b].flat;
    // The reducer outlives its slots' preparations: both die with it.
    slot.prepare = [&r, b](std::vector<torch::Tensor>* hold) { return r.fill(b, hold); };
    r.reducer.add_slot(std::move(slot));
  }

  std::weak_ptr<Reducer> weak = reducer_;
  r.hooks.install(
      params,
      [weak](size_t i) {
        if (auto reducer = weak.lock()) reducer->on_gradient_accumulated(i);
      },
      [](size_t i) { return "ddp: parameter " + std::to_string(i); });
}

torch::Tensor DistributedDataParallel::forward(models::Model& model, const torch::Tensor& inputs) {
  check(reducer_ != nullptr, "ddp: forward() before prepare()");
  if (!model.is_training()) return model.forward(inputs);
  if (torch::GradMode::is_enabled()) reducer_->bind_gradients();
  // At every world size, as PyTorch's DDP: one broadcast a flat buffer, in place.
  if (options_.broadcast_buffers && !buffer_flats_.empty()) {
    std::vector<torch::Tensor> buffers;
    for (const auto& flat : buffer_flats_) buffers.push_back(as_movable(*group_, flat));
    torch::NoGradGuard no_grad;
    group_->broadcast(buffers, 0).wait();
  }
  std::vector<int64_t> calls_before;
  for (const auto& norm : sync_norms_) calls_before.push_back(norm.module->calls());
  auto outputs = model.forward(inputs);
  for (size_t i = 0; i < sync_norms_.size(); ++i) {
    check(sync_norms_[i].module->calls() > calls_before[i],
          "--sync-batchnorm: model '" + model.name() + "' did not call the synchronised batch norm that replaced '" +
              sync_norms_[i].name +
              "'; its forward reaches the layer through a member handle rather than its registered child, so "
              "batch statistics would silently stay per-rank");
  }
  return outputs;
}

void DistributedDataParallel::set_gradient_sync(bool enabled) {
  check(reducer_ != nullptr, "ddp: set_gradient_sync() before prepare()");
  std::lock_guard<std::mutex> lock(reducer_->mutex);
  reducer_->sync = enabled;
}

void DistributedDataParallel::finish_backward() {
  check(reducer_ != nullptr, "ddp: finish_backward() before prepare()");
  reducer_->finish();
}

torch::Tensor DistributedDataParallel::all_reduce_sum(torch::Tensor t) {
  std::vector<torch::Tensor> one{t};
  group_->all_reduce_sum(one).wait();
  return t;
}

std::string DistributedDataParallel::capture_obstacle() const {
  if (!group_->stream_ordered()) return "--strategy ddp over gloo waits for its all-reduces on the host";
  if (!sync_norms_.empty()) return "--sync-batchnorm reads the batch's sample count on the host";
  return "";
}

size_t DistributedDataParallel::reductions_started() const {
  if (!reducer_) return 0;
  std::lock_guard<std::mutex> lock(reducer_->mutex);
  return reducer_->reducer.launched();
}

size_t DistributedDataParallel::reductions_completed() const {
  if (!reducer_) return 0;
  std::lock_guard<std::mutex> lock(reducer_->mutex);
  return reducer_->reducer.completed();
}

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_layout() const {
  std::vector<std::vector<size_t>> layout;
  if (!reducer_) return layout;
  for (const auto& bucket : reducer_->buckets) layout.push_back(bucket.params);
  return layout;
}

}  // namespace ptrain::strategies
