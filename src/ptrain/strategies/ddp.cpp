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
    torch::Tensor flat;  // from the bucket's first gradient of a step to the end of its reduction
    int64_t numel = 0;
    std::vector<size_t> params;
    std::vector<int64_t> offsets;
    size_t pending = 0;
  };

  Reducer(std::shared_ptr<distributed::ProcessGroup> g, const DdpOptions& o, torch::Device device)
      : group(std::move(g)),
        streams(distributed::make_comm_streams(*group, device)),
        reducer({o.reduce_dtype, o.overlap}, streams) {}

  std::shared_ptr<distributed::ProcessGroup> group;
  std::shared_ptr<distributed::CommStreams> streams;
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

  // Gradients live in their buckets, as PyTorch DDP's gradient_as_bucket_view: autograd accumulates into the
  // bucket in place, the all-reduce averages it there and the optimizer reads it there, with no copy in or out.
  // A bucket exists only from the step's backward to its optimizer step, as a single device's gradients do: it
  // is allocated when its first gradient arrives (that gradient copied in, the others' views bound, zeroed) and
  // the next bucket with it, so that its gradients arrive in place; after the reduction the buckets live on
  // only in the gradients, which the optimizer's zero_grad frees. Held between steps, they would add a whole
  // copy of the gradients to the peak of the next forward. Caller holds mutex.
  void ensure_bucket(size_t b) {
    auto& bucket = buckets[b];
    if (bucket.flat.defined()) return;
    torch::NoGradGuard no_grad;
    bucket.flat = torch::zeros({bucket.numel}, params[bucket.params.front()].options().requires_grad(false));
    std::vector<torch::Tensor> members, views;
    for (const size_t index : bucket.params) {
      members.push_back(params[index]);
      views.push_back(view_of(index));
    }
    bind_gradients_to_views(members, views);
  }

  // The bucket's gradients into its flat buffer (zeros for parameters without one), when it launches.
  void fill(size_t b, std::vector<torch::Tensor>* hold) {
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
  }

  // Caller holds mutex.
  void mark_ready_locked(size_t index) {
    check(!ready[index], "ddp: parameter " + std::to_string(index) +
                             " received its gradient twice in one synchronised step (several backward calls "
                             "before finish_backward?)");
    ready[index] = true;
    const size_t b = bucket_of[index];
    if (buckets[b].pending == buckets[b].params.size()) {  // the bucket's first gradient this step
      ensure_bucket(b);
      if (b + 1 < buckets.size()) ensure_bucket(b + 1);
    }
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
    for (auto& bucket : buckets) {
      bucket.pending = bucket.params.size();
      bucket.flat = torch::Tensor();  // alive in the gradients until the optimizer is done with them
    }
  }
};

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<distributed::ProcessGroup> group, torch::Device device,
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
    bucket.numel = numel;
    bucket.pending = members.size();
    bucket.params = std::move(members);
    r.buckets.push_back(std::move(bucket));
  }
  for (size_t b = 0; b < r.buckets.size(); ++b) {
    ReductionSlot slot;
    slot.all = group_;
    // The reducer outlives its slots' functions: both die with it. Called under its mutex.
    slot.buffers = [&r, b] {
      r.ensure_bucket(b);
      return ReductionBuffers{r.buckets[b].flat, r.buckets[b].flat};
    };
    slot.fill = [&r, b](const torch::Tensor&, std::vector<torch::Tensor>* hold) { r.fill(b, hold); };
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
  // At every world size, as PyTorch's DDP: one broadcast a flat buffer, in place (over NCCL ordered on the
  // stream, so that a captured step replays it).
  if (options_.broadcast_buffers) sync_buffers();
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

void DistributedDataParallel::sync_buffers() {
  check(reducer_ != nullptr, "ddp: sync_buffers() before prepare()");
  if (buffer_flats_.empty()) return;
  std::vector<torch::Tensor> buffers;
  for (const auto& flat : buffer_flats_) buffers.push_back(as_movable(*group_, flat));
  torch::NoGradGuard no_grad;
  group_->broadcast(buffers, 0).wait();
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

size_t DistributedDataParallel::buckets_held() const {
  if (!reducer_) return 0;
  std::lock_guard<std::mutex> lock(reducer_->mutex);
  return static_cast<size_t>(std::count_if(reducer_->buckets.begin(), reducer_->buckets.end(),
                                           [](const Reducer::Bucket& b) { return b.flat.defined(); }));
}

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_layout() const {
  std::vector<std::vector<size_t>> layout;
  if (!reducer_) return layout;
  for (const auto& bucket : reducer_->buckets) layout.push_back(bucket.params);
  return layout;
}

}  // namespace ptrain::strategies
