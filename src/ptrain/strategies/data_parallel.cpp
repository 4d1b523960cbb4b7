#include "ptrain/strategies/data_parallel.h"

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include <c10/core/DeviceGuard.h>

#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/precision/autocast_guard.h"

namespace ptrain::strategies {

// Named rather than anonymous: classes with external linkage below hold these types, which GCC warns about
// (-Wsubobject-linkage) when a unity build includes this file into another.
namespace data_parallel_parts {

// A view of flat[offset, offset + numel) with like's shape and strides.
torch::Tensor view_like(const torch::Tensor& flat, int64_t offset, const torch::Tensor& like) {
  return flat.narrow(0, offset, like.numel()).as_strided(like.sizes(), like.strides());
}

// Tensors of one dtype (one group of parameters, or of buffers) in one flat buffer per device. Tensor
// k of every device is a view of the same range of its device's buffer.
struct FlatGroup {
  std::vector<torch::Tensor> buffers;                // one per device
  std::vector<std::vector<torch::Tensor>> tensors;   // [device][k]: the parameters or buffers
  std::vector<int64_t> offsets;                      // [k]

  void broadcast_from_first() {
    if (buffers.front().is_cuda() && compat::nccl_broadcast_from_first(buffers)) return;
    torch::NoGradGuard no_grad;
    for (size_t d = 1; d < buffers.size(); ++d) buffers[d].copy_(buffers.front());
  }

  // Sums the buffers into the first one.
  void reduce_into_first() {
    if (buffers.front().is_cuda() && compat::nccl_reduce_into_first(buffers)) return;
    torch::NoGradGuard no_grad;
    for (size_t d = 1; d < buffers.size(); ++d) buffers.front().add_(buffers[d].to(buffers.front().device()));
  }
};

// Groups tensors (the same k-th tensor on every device) by dtype, and moves each device's tensors into
// its flat buffer, keeping their values. set_data keeps the tensors' identity (optimizers, autograd
// and the model's modules hold them), only their storage changes.
std::vector<FlatGroup> flatten(const std::vector<std::vector<torch::Tensor>>& per_device) {
  std::map<torch::ScalarType, FlatGroup> groups;
  const size_t devices = per_device.size();
  std::map<torch::ScalarType, int64_t> sizes;
  for (size_t k = 0; k < per_device.front().size(); ++k) {
    const auto& t = per_device.front()[k];
    auto& group = groups[t.scalar_type()];
    if (group.tensors.empty()) group.tensors.resize(devices);
    group.offsets.push_back(sizes[t.scalar_type()]);
    sizes[t.scalar_type()] += t.numel();
    for (size_t d = 0; d < devices; ++d) group.tensors[d].push_back(per_device[d][k]);
  }
  std::vector<FlatGroup> result;
  torch::NoGradGuard no_grad;
  for (auto& [dtype, group] : groups) {
    for (size_t d = 0; d < devices; ++d) {
      const auto device = group.tensors[d].front().device();
      group.buffers.push_back(torch::empty({sizes[dtype]}, torch::TensorOptions().dtype(dtype).device(device)));
      for (size_t k = 0; k < group.tensors[d].size(); ++k) {
        auto& t = group.tensors[d][k];
        // The replicas take the first device's memory layout, so that the buffers match element for element.
        auto view = view_like(group.buffers[d], group.offsets[k], group.tensors[0][k]);
        view.copy_(t);
        t.set_data(view);
      }
    }
    result.push_back(std::move(group));
  }
  return result;
}

}  // namespace data_parallel_parts
using namespace data_parallel_parts;

// One thread per replica after the first, alive as long as the strategy: LibTorch 2.x caches cuDNN's
// execution plans (and, in benchmark mode, the autotuning that picks them) per thread, so a fresh thread
// every step, as std::async or Python's DataParallel make, tunes every convolution again. (With a thread a
// step, dp on two H200s trained 170 img/s where one H200 alone trains 2,300.)
class ReplicaWorker {
 public:
  ReplicaWorker() : thread_([this] { loop(); }) {}
  ~ReplicaWorker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }
  ReplicaWorker(const ReplicaWorker&) = delete;
  ReplicaWorker& operator=(const ReplicaWorker&) = delete;

  std::future<torch::Tensor> submit(std::function<torch::Tensor()> work) {
    std::packaged_task<torch::Tensor()> task(std::move(work));
    auto result = task.get_future();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(task));
    }
    wake_.notify_one();
    return result;
  }

 private:
  void loop() {
    while (true) {
      std::packaged_task<torch::Tensor()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();  // an exception lands in the task's future
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::packaged_task<torch::Tensor()>> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: it starts once everything it uses exists
};

struct DataParallel::State {
  std::vector<std::shared_ptr<models::Model>> replicas;  // [0] is the prepared model itself
  std::vector<FlatGroup> params, buffers;
  std::vector<FlatGroup> grads;  // same layout as params
  bool params_stale = true;      // the first device's parameters changed since the last broadcast

  // Points every parameter's .grad at its range of the gradient buffers. The trainer's zero_grad()
  // drops the first device's gradients after each step; undefined ones get their zeroed range back.
  void attach_grads() {
    for (auto& group : grads) {
      for (size_t d = 0; d < group.buffers.size(); ++d) {
        auto& params_d = params_group_for(group).tensors[d];
        bool all_undefined = true;
        for (const auto& p : params_d) all_undefined = all_undefined && !p.grad().defined();
        if (all_undefined) group.buffers[d].zero_();
        for (size_t k = 0; k < params_d.size(); ++k) {
          auto p = params_d[k];
          if (p.grad().defined()) continue;
          auto view = group.tensors[d][k];
          if (!all_undefined) view.zero_();
          p.mutable_grad() = view;
        }
      }
    }
  }

  FlatGroup& params_group_for(const FlatGroup& grads_group) { return params[&grads_group - grads.data()]; }

  // Declared last, so destroyed first: no worker outlives the replicas it runs.
  std::vector<std::unique_ptr<ReplicaWorker>> workers;  // [d - 1] runs replica d
};

DataParallel::DataParallel(std::vector<torch::Device> devices) : devices_(std::move(devices)) {
  check(!devices_.empty(), "dp: no devices");
  for (const auto& d : devices_)
    check(d.type() == devices_.front().type(), "dp: the devices must be all CUDA or all CPU");
}

DataParallel::~DataParallel() = default;

void DataParallel::prepare(models::Model& model) {
  state_ = std::make_unique<State>();
  auto& s = *state_;
  s.replicas.push_back(std::dynamic_pointer_cast<models::Model>(model.shared_from_this()));
  check(s.replicas.front() != nullptr, "dp: the model must be held by a shared_ptr");
  for (const auto& p : model.parameters())
    check(p.device() == devices_.front(), "dp: the model's parameters must be on " + devices_.front().str() +
                                              ", found one on " + p.device().str());
  for (size_t d = 1; d < devices_.size(); ++d) {
    auto replica = model.make_replica();
    replica->to(devices_[d]);
    replica->train(model.is_training());
    s.replicas.push_back(std::move(replica));
  }
  std::vector<std::vector<torch::Tensor>> params, buffers;
  for (auto& replica : s.replicas) {
    params.push_back(replica->parameters());
    buffers.push_back(replica->buffers());
    check(params.back().size() == params.front().size() && buffers.back().size() == buffers.front().size(),
          "dp: a replica of model '" + model.name() + "' has other parameters than the model");
  }
  // Replicas are made in fp32; the model may be in half already.
  torch::NoGradGuard no_grad;
  for (size_t d = 1; d < s.replicas.size(); ++d) {
    for (size_t k = 0; k < params[d].size(); ++k) {
      check(params[d][k].sizes() == params[0][k].sizes(), "dp: a replica's parameter shapes differ from the model's");
      params[d][k].set_data(params[d][k].to(params[0][k].scalar_type()));
    }
    for (size_t k = 0; k < buffers[d].size(); ++k) buffers[d][k].set_data(buffers[d][k].to(buffers[0][k].scalar_type()));
  }
  s.params = flatten(params);
  s.buffers = flatten(buffers);
  // Gradient buffers shaped like the parameter buffers, views of them shaped like the parameters.
  for (const auto& group : s.params) {
    FlatGroup g;
    g.offsets = group.offsets;
    g.tensors.resize(group.buffers.size());
    for (size_t d = 0; d < group.buffers.size(); ++d) {
      g.buffers.push_back(torch::zeros_like(group.buffers[d]));
      for (size_t k = 0; k < group.tensors[d].size(); ++k)
        g.tensors[d].push_back(view_like(g.buffers[d], g.offsets[k], group.tensors[0][k]));
    }
    s.grads.push_back(std::move(g));
  }
  for (size_t d = 1; d < devices_.size(); ++d) s.workers.push_back(std::make_unique<ReplicaWorker>());
  s.params_stale = true;
}

torch::Tensor DataParallel::forward(models::Model& model, const torch::Tensor& inputs) {
  check(state_ != nullptr, "dp: forward before prepare");
  auto& s = *state_;
  {
    torch::NoGradGuard no_grad;
    if (s.params_stale) {
      for (auto& group : s.params) group.broadcast_from_first();
      s.params_stale = false;
    }
    for (auto& group : s.buffers) group.broadcast_from_first();
  }
  const bool training = model.is_training();
  const bool grad_enabled = torch::GradMode::is_enabled();
  if (training && grad_enabled) s.attach_grads();
  if (devices_.size() == 1) return model.forward(inputs);

  const auto parts = inputs.chunk(static_cast<int64_t>(devices_.size()), 0);
  const auto device_type = devices_.front().type();
  const bool autocast = compat::autocast_enabled(device_type);
  const auto autocast_dtype = compat::autocast_dtype(device_type);
  // Thread-local state (grad mode, autocast) is what the caller set for this forward; each worker sets
  // the same for its replica, and its autocast guard clears that thread's cast cache on exit.
  std::vector<std::future<torch::Tensor>> outputs;
  for (size_t d = 1; d < parts.size(); ++d) {
    outputs.push_back(s.workers[d - 1]->submit([&, d] {
      c10::OptionalDeviceGuard device_guard;
      if (devices_[d].is_cuda()) device_guard.reset_device(devices_[d]);
      torch::AutoGradMode grad_mode(grad_enabled);
      precision::AutocastGuard autocast_guard(device_type, autocast, autocast_dtype);
      auto& replica = *s.replicas[d];
      if (replica.is_training() != training) replica.train(training);
      return replica.forward(parts[d].to(devices_[d], /*non_blocking=*/true));
    }));
  }
  // The workers read this frame's locals: every one must be done before it unwinds, error or not.
  const auto wait_all = [&outputs] {
    for (auto& out : outputs) {
      if (out.valid()) out.wait();
    }
  };
  std::vector<torch::Tensor> gathered;
  try {
    gathered.push_back(model.forward(parts[0]));
  } catch (...) {
    wait_all();
    throw;
  }
  wait_all();
  for (auto& out : outputs) gathered.push_back(out.get().to(devices_.front()));
  return torch::cat(gathered, 0);
}

void DataParallel::finish_backward() {
  check(state_ != nullptr, "dp: finish_backward before prepare");
  auto& s = *state_;
  torch::NoGradGuard no_grad;
  for (size_t g = 0; g < s.grads.size(); ++g) {
    auto& grads = s.grads[g];
    auto& params = s.params[g];
    // Gradients that autograd created anew (none, unless the caller replaced .grad) move into the buffer.
    for (size_t d = 0; d < grads.buffers.size(); ++d) {
      for (size_t k = 0; k < params.tensors[d].size(); ++k) {
        auto p = params.tensors[d][k];
        auto& view = grads.tensors[d][k];
        if (!p.grad().defined()) {
          view.zero_();
        } else if (!p.grad().is_same(view)) {
          view.copy_(p.grad());
        }
        p.mutable_grad() = view;
      }
    }
    grads.reduce_into_first();
    for (size_t d = 1; d < grads.buffers.size(); ++d) grads.buffers[d].zero_();
  }
  s.params_stale = true;
}

}  // namespace ptrain::strategies
