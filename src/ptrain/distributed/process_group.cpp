#include "ptrain/distributed/process_group.h"

#include <algorithm>
#include <chrono>
#include <sstream>
#include <thread>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/distributed/nccl_group.h"

namespace ptrain::distributed {

struct ProcessGroup::Backend {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<compat::C10dBackend> group;
};

struct Work::Impl {
  std::string operation;
  std::string where;  // "rank 1 of 3 (gloo, timeout 5 s)"
  std::chrono::milliseconds timeout{0};
  // NCCL: wait() orders the current stream after the work and returns; its timeout is the watchdog's.
  // (PyTorch 2.x blocks the host until the collective is done when wait() is given a timeout, which
  // would drain the GPU's queue at every wait.) gloo: wait() blocks the host, bounded by the timeout.
  bool stream_ordered = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::function<void()> after;  // copy-back from packed buffers, once every work has finished
  bool done = false;
};

namespace {

std::string describe(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

std::string seconds_text(std::chrono::milliseconds timeout) {
  std::ostringstream out;
  out << static_cast<double>(timeout.count()) / 1000.0 << " s";
  return out.str();
}

[[noreturn]] void fail(const std::string& operation, const std::string& where, const std::exception& e) {
  throw Error("dist: " + operation + " on " + where +
              " did not complete: it timed out or a peer failed (" + describe(e) + ")");
}

// Tensors of one dtype and device travel together in one flat buffer.
struct PackedGroup {
  std::vector<torch::Tensor> members;
  torch::Tensor flat;
};

std::vector<PackedGroup> pack(const std::vector<torch::Tensor>& tensors) {
  std::vector<PackedGroup> groups;
  for (const auto& t : tensors) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const PackedGroup& g) {
      return g.members.front().scalar_type() == t.scalar_type() && g.members.front().device() == t.device();
    });
    if (it == groups.end()) {
      groups.push_back({{t}, {}});
    } else {
      it->members.push_back(t);
    }
  }
  for (auto& g : groups) {
    // A contiguous tensor alone in its group (a flat buffer already) travels as it is: nothing to pack or unpack.
    if (g.members.size() == 1 && g.members.front().is_contiguous()) {
      g.flat = g.members.front().view({-1});
      continue;
    }
    std::vector<torch::Tensor> flat_views;
    flat_views.reserve(g.members.size());
    for (const auto& t : g.members) flat_views.push_back(t.reshape({-1}));
    g.flat = torch::cat(flat_views);
  }
  return groups;
}

void unpack(std::vector<PackedGroup>& groups) {
  torch::NoGradGuard no_grad;
  for (auto& g : groups) {
    if (g.members.size() == 1 && g.flat.data_ptr() == g.members.front().data_ptr()) continue;  // travelled itself
    int64_t offset = 0;
    for (auto& t : g.members) {
      t.copy_(g.flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

std::vector<uint8_t> bytes_of(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }

std::string text_of(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

// The store's first key names the job whose rank 0 hosts it. A rank that reached another job's store (a
// port taken by another job, a stale MASTER_PORT) leaves before writing anything the other job reads.
void refuse_another_jobs_store(c10d::Store& store, const LaunchEnvironment& env, std::chrono::milliseconds timeout) {
  const std::string key = "ptrain/run_id";
  const std::string address = env.master_addr + ":" + std::to_string(env.master_port);
  std::string store_run_id;
  try {
    if (env.rank == 0) {
      store.set(key, bytes_of(env.run_id));
      return;
    }
    store_run_id = text_of(store.get(key));
  } catch (const std::exception& e) {
    throw Error("dist: the rendezvous store at " + address + " named no ptrain job within " + seconds_text(timeout) +
                " for rank " + std::to_string(env.rank) + " (is another program listening on that port?): " +
                describe(e));
  }
  const auto shown = [](const std::string& id) { return id.empty() ? std::string("none") : "'" + id + "'"; };
  check(store_run_id == env.run_id,
        "dist: the rendezvous store at " + address + " belongs to another job (its run id " + shown(store_run_id) +
            ", rank " + std::to_string(env.rank) + "'s " + shown(env.run_id) +
            "), so this rank leaves it alone: choose a free --master-port or MASTER_PORT (ptrain launch picks a free "
            "one on a single node when --master-port is left out)");
}

}  // namespace

void Work::wait() {
  if (!impl_ || impl_->done) return;
  impl_->done = true;
  for (auto& work : impl_->works) {
    try {
      if (impl_->stream_ordered) {
        work->wait();
      } else {
        work->wait(impl_->timeout);
      }
    } catch (const std::exception& e) {
      fail(impl_->operation, impl_->where, e);
    }
  }
  if (impl_->after) impl_->after();
  impl_.reset();
}

bool Work::completed() const {
  if (!impl_) return true;
  return std::all_of(impl_->works.begin(), impl_->works.end(), [](const auto& work) { return work->isCompleted(); });
}

std::optional<ProcessGroup::Kind> ProcessGroup::backend_kind(const std::string& name) {
  if (name == "gloo") return Kind::gloo;
  if (name == "nccl") return Kind::nccl;
  return std::nullopt;
}

ProcessGroup::Kind ProcessGroup::known_backend(const std::string& name) {
  const auto kind = backend_kind(name);
  check(kind.has_value(), "--backend: unknown '" + name + "' (known: gloo, nccl)");
  return *kind;
}

std::string ProcessGroup::backend_name(Kind kind) { return kind == Kind::gloo ? "gloo" : "nccl"; }

bool ProcessGroup::backend_available(const std::string& backend) {
  const auto kind = backend_kind(backend);
  if (!kind) return false;
  return *kind == Kind::gloo ? compat::has_gloo() : nccl_group_available();
}

ProcessGroup::ProcessGroup(const LaunchEnvironment& env, const std::string& backend,
                           std::chrono::milliseconds timeout)
    : rank_(env.rank),
      world_size_(env.world_size),
      kind_(known_backend(backend)),
      timeout_(timeout),
      impl_(std::make_unique<Backend>()) {
  check(kind_ != Kind::nccl || nccl_group_available(),
        "--backend nccl needs a CUDA build of LibTorch; this one is CPU-only (use gloo)");
  check(kind_ != Kind::gloo || compat::has_gloo(),
        "--backend gloo: this LibTorch was installed without gloo's headers (use nccl)");
  check(timeout.count() > 0, "--dist-timeout must be positive");
  check(env.master_port > 0 && env.master_port < 65536, "dist: MASTER_PORT " + std::to_string(env.master_port) +
                                                             " is not a TCP port");
  const std::string where_text = where();
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(env.master_port);
  store_options.isServer = rank_ == 0;
  store_options.numWorkers = static_cast<std::size_t>(world_size_);
  // The ranks are counted below on the one deadline: LibTorch 1.13's server, left to wait for them itself,
  // returned after 1.35 timeouts without saying that some never came, and the group's own rendezvous then
  // waited a second timeout (7.3 s for 3).
  store_options.waitWorkers = false;
  store_options.timeout = timeout;
  const auto started = std::chrono::steady_clock::now();
  const auto rendezvous_failed = [&](const std::string& why) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    return Error("dist: rendezvous at " + env.master_addr + ":" + std::to_string(env.master_port) + " failed for " +
                 where_text + " after " + seconds_text(waited) +
                 " (are all ranks started, MASTER_ADDR/MASTER_PORT the same everywhere and the port free?): " + why);
  };
  c10::intrusive_ptr<c10d::Store> tcp_store;
  try {
    tcp_store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
    // Every rank counts itself in and waits for the others until the deadline; once all are in, the
    // group's rendezvous finds them at once.
    const std::string arrived_key = "ptrain/ranks_arrived";
    tcp_store->add(arrived_key, 1);
    for (;;) {
      const int64_t arrived = tcp_store->add(arrived_key, 0);
      if (arrived >= world_size_) break;
      if (std::chrono::steady_clock::now() - started >= timeout) {
        throw rendezvous_failed(std::to_string(arrived) + " of " + std::to_string(world_size_) +
                                " ranks arrived within --dist-timeout " + seconds_text(timeout));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw rendezvous_failed(describe(e));
  }
  refuse_another_jobs_store(*tcp_store, env, timeout);
  impl_->store = c10::make_intrusive<c10d::PrefixStore>("ptrain/" + backend, tcp_store);
  try {
    impl_->group = kind_ == Kind::gloo
                       ? compat::make_gloo_group(impl_->store, static_cast<int>(rank_), static_cast<int>(world_size_),
                                                 timeout, env.master_addr)
                       : make_nccl_group(impl_->store, static_cast<int>(rank_), static_cast<int>(world_size_), timeout);
  } catch (const std::exception& e) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    throw Error("dist: rendezvous of the " + backend + " process group failed for " + where_text + " after " +
                seconds_text(waited) + ": " + describe(e));
  }
}

ProcessGroup::ProcessGroup(int64_t rank, int64_t world_size, Kind kind, std::chrono::milliseconds timeout)
    : rank_(rank),
      world_size_(world_size),
      kind_(kind),
      timeout_(timeout),
      impl_(std::make_unique<Backend>()) {}

ProcessGroup::~ProcessGroup() = default;

std::shared_ptr<ProcessGroup> ProcessGroup::subgroup(const std::vector<int64_t>& ranks, const std::string& name) {
  auto me = std::find(ranks.begin(), ranks.end(), rank_);
  check(me != ranks.end(), "dist: rank " + std::to_string(rank_) + " is not a member of subgroup '" + name + "'");
  for (const auto r : ranks)
    check(r >= 0 && r < world_size_, "dist: subgroup '" + name + "' names rank " + std::to_string(r) + " of a group of " +
                                         std::to_string(world_size_));
  const auto sub_rank = static_cast<int64_t>(me - ranks.begin());
  const auto sub_size = static_cast<int64_t>(ranks.size());
  std::shared_ptr<ProcessGroup> sub(new ProcessGroup(sub_rank, sub_size, kind_, timeout_));
  sub->impl_->store = c10::make_intrusive<c10d::PrefixStore>(name, impl_->store);
  try {
    sub->impl_->group = kind_ == Kind::gloo ? compat::make_gloo_subgroup(*impl_->group, sub->impl_->store,
                                                                         static_cast<int>(sub_rank),
                                                                         static_cast<int>(sub_size), timeout_)
                                            : make_nccl_group(sub->impl_->store, static_cast<int>(sub_rank),
                                                              static_cast<int>(sub_size), timeout_);
  } catch (const std::exception& e) {
    throw Error("dist: subgroup '" + name + "' of " + where() + " did not form: " + describe(e));
  }
  return sub;
}

std::vector<std::string> ProcessGroup::all_gather_text(const std::string& name, const std::string& text) {
  const std::string prefix = "text/" + name + "/";
  std::vector<std::string> texts;
  try {
    auto& store = *impl_->store;
    store.set(prefix + std::to_string(rank_), bytes_of(text));
    for (int64_t r = 0; r < world_size_; ++r) texts.push_back(text_of(store.get(prefix + std::to_string(r))));
    store.set(prefix + "read/" + std::to_string(rank_), bytes_of("1"));
    if (rank_ == 0) {
      std::vector<std::string> read;
      for (int64_t r = 0; r < world_size_; ++r) read.push_back(prefix + "read/" + std::to_string(r));
      store.wait(read, timeout_);
    }
  } catch (const std::exception& e) {
    fail("all_gather_text '" + name + "'", where(), e);
  }
  return texts;
}

std::string ProcessGroup::where() const {
  return "rank " + std::to_string(rank_) + " of " + std::to_string(world_size_) + " (" + backend_name(kind_) + ", timeout " +
         seconds_text(timeout_) + ")";
}

namespace {

// Starts c10d work items into impl (ProcessGroup::new_work); turns a failure to even start them into the
// same error.
template <typename Launch>
Work start(std::shared_ptr<Work::Impl> impl, Launch&& launch, std::function<void()> after = {}) {
  impl->after = std::move(after);
  try {
    launch(impl->works);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail(impl->operation, impl->where, e);
  }
  return Work(std::move(impl));
}

}  // namespace

std::shared_ptr<Work::Impl> ProcessGroup::new_work(const std::string& operation) const {
  auto impl = std::make_shared<Work::Impl>();
  impl->operation = operation;
  impl->where = where();
  impl->timeout = timeout_;
  impl->stream_ordered = stream_ordered();
  return impl;
}

Work ProcessGroup::all_reduce_sum(std::vector<torch::Tensor>& tensors) {
  if (tensors.empty()) return {};
  auto& group = impl_->group;
  if (tensors.size() == 1 && tensors.front().is_contiguous()) {
    return start(new_work("all_reduce_sum"), [&](auto& works) {
      std::vector<at::Tensor> one{tensors.front()};
      works.push_back(group->allreduce(one, c10d::AllreduceOptions()));
    });
  }
  auto packed = std::make_shared<std::vector<PackedGroup>>(pack(tensors));
  return start(
      new_work("all_reduce_sum"),
      [&](auto& works) {
        for (auto& g : *packed) {
          std::vector<at::Tensor> one{g.flat};
          works.push_back(group->allreduce(one, c10d::AllreduceOptions()));
        }
      },
      [packed] { unpack(*packed); });
}

Work ProcessGroup::broadcast(std::vector<torch::Tensor>& tensors, int64_t root) {
  check(root >= 0 && root < world_size_, "dist: broadcast root " + std::to_string(root) + " is outside [0, " +
                                             std::to_string(world_size_) + ")");
  if (tensors.empty()) return {};
  auto packed = std::make_shared<std::vector<PackedGroup>>(pack(tensors));
  auto& group = impl_->group;
  return start(
      new_work("broadcast from rank " + std::to_string(root)),
      [&](auto& works) {
        for (auto& g : *packed) {
          std::vector<at::Tensor> one{g.flat};
          c10d::BroadcastOptions options;
          options.rootRank = static_cast<int>(root);
          options.rootTensor = 0;
          works.push_back(group->broadcast(one, options));
        }
      },
      [packed] { unpack(*packed); });
}

Work ProcessGroup::barrier() {
  auto& group = impl_->group;
  return start(new_work("barrier"), [&](auto& works) { works.push_back(group->barrier(c10d::BarrierOptions())); });
}

Work ProcessGroup::all_gather(const torch::Tensor& input, std::vector<torch::Tensor>* per_rank) {
  auto flat = torch::empty({world_size_ * input.numel()}, input.options());
  per_rank->clear();
  for (int64_t r = 0; r < world_size_; ++r) per_rank->push_back(flat.narrow(0, r * input.numel(), input.numel()).view(input.sizes()));
  return all_gather_into(flat, input);
}

Work ProcessGroup::all_gather_into(const torch::Tensor& output_flat, const torch::Tensor& input_shard) {
  const int64_t n = input_shard.numel();
  check(output_flat.numel() == world_size_ * n,
        "dist: all_gather_into needs an output of world_size * shard = " + std::to_string(world_size_ * n) +
            " elements, got " + std::to_string(output_flat.numel()));
  check(output_flat.scalar_type() == input_shard.scalar_type(), "dist: all_gather_into output and shard dtypes differ");
  check(output_flat.is_contiguous(), "dist: all_gather_into needs a contiguous output");
  auto input = input_shard.contiguous().view({-1});
  auto output = output_flat.view({-1});
  auto& group = impl_->group;
  return start(new_work("all_gather"), [&](auto& works) {
    if (kind_ == Kind::nccl) {
      works.push_back(group->_allgather_base(output, input, c10d::AllgatherOptions()));
      return;
    }
    // gloo (1.13) has no flat all-gather: it fills one output tensor per rank, here views of output.
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int64_t r = 0; r < world_size_; ++r) outputs[0].push_back(output.narrow(0, r * n, n));
    std::vector<at::Tensor> inputs{input};
    works.push_back(group->allgather(outputs, inputs, c10d::AllgatherOptions()));
  });
}

Work ProcessGroup::reduce_scatter_sum(const torch::Tensor& output_shard, const torch::Tensor& input_flat) {
  const int64_t n = output_shard.numel();
  check(input_flat.numel() == world_size_ * n,
        "dist: reduce_scatter_sum needs an input of world_size * shard = " + std::to_string(world_size_ * n) +
            " elements, got " + std::to_string(input_flat.numel()));
  check(output_shard.scalar_type() == input_flat.scalar_type(), "dist: reduce_scatter_sum output and input dtypes differ");
  auto& group = impl_->group;
  if (kind_ == Kind::nccl) {
    const bool direct = output_shard.is_contiguous();
    auto output = direct ? output_shard.view({-1}) : torch::empty({n}, output_shard.options());
    auto input = input_flat.contiguous().view({-1});
    std::function<void()> copy_back;
    if (!direct) {
      copy_back = [output, output_shard] {
        torch::NoGradGuard no_grad;
        torch::Tensor(output_shard).copy_(output.view(output_shard.sizes()));
      };
    }
    return start(
        new_work("reduce_scatter_sum"),
        [&](auto& works) { works.push_back(group->_reduce_scatter_base(output, input, c10d::ReduceScatterOptions())); },
        std::move(copy_back));
  }
  // gloo: every rank sums the whole buffer; the wait copies this rank's slice out.
  auto summed = input_flat.reshape({-1}).clone();
  const int64_t offset = rank_ * n;
  return start(
      new_work("reduce_scatter_sum"),
      [&](auto& works) {
        std::vector<at::Tensor> one{summed};
        works.push_back(group->allreduce(one, c10d::AllreduceOptions()));
      },
      [summed, output_shard, offset, n] {
        torch::NoGradGuard no_grad;
        torch::Tensor(output_shard).copy_(summed.narrow(0, offset, n).view(output_shard.sizes()));
      });
}

}  // namespace ptrain::distributed
