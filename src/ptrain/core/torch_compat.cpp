// The parts of the compatibility layer too heavy for its header: the profiler trace's file handling and
// gloo's process groups.
#include "ptrain/core/torch_compat.h"

#include <cstdio>
#include <cstdlib>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
// The PyTorch wheel ships no gloo headers, so a build against it has NCCL only.
#if __has_include(<gloo/algorithm.h>)
#define PTRAIN_HAVE_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#else
#define PTRAIN_HAVE_GLOO 0
#endif

#include "ptrain/core/error.h"
#include "ptrain/core/profiler_session.h"

namespace ptrain::compat {

namespace {

struct TraceState {
  bool running = false;
  std::string path;
};

TraceState& trace_state() {
  static TraceState state;
  return state;
}

std::string temporary_beside(const std::string& path) { return path + ".tmp"; }

void rename_into_place(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    std::remove(from.c_str());
    throw Error("--profile-out " + to + ": cannot write the trace there");
  }
}

std::string describe(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

}  // namespace

void start_profiler_trace(bool with_cuda, const std::string& path) {
  auto& state = trace_state();
  check(!state.running, "profiler: a trace is already running");
  state.path = path;
  profiler_session::start(with_cuda);
  state.running = true;
}

void stop_profiler_trace() {
  auto& state = trace_state();
  check(state.running, "profiler: no trace is running");
  state.running = false;
  const std::string temporary = temporary_beside(state.path);
  try {
    profiler_session::stop_into(temporary);
  } catch (const std::exception& e) {
    std::remove(temporary.c_str());
    throw Error("--profile-out " + state.path + ": the trace could not be written: " + describe(e));
  }
  rename_into_place(temporary, state.path);
}

#if PTRAIN_HAVE_GLOO

namespace {

std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& master_addr) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname != '\0') {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  // A single-node job talks over loopback; resolving the host name there can pick an address other
  // processes in a container cannot reach.
  if (master_addr == "127.0.0.1" || master_addr == "localhost") {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

bool has_gloo() { return true; }

c10::intrusive_ptr<C10dBackend> make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                int world_size, std::chrono::milliseconds timeout,
                                                const std::string& master_addr) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(gloo_device(master_addr));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options);
}

c10::intrusive_ptr<C10dBackend> make_gloo_subgroup(C10dBackend& parent, const c10::intrusive_ptr<c10d::Store>& store,
                                                   int rank, int world_size, std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices = static_cast<c10d::ProcessGroupGloo&>(parent).getOptions()->devices;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options);
}

#else

namespace {
[[noreturn]] void no_gloo() { throw Error("--backend gloo: this LibTorch was installed without gloo's headers (use nccl)"); }
}  // namespace

bool has_gloo() { return false; }

c10::intrusive_ptr<C10dBackend> make_gloo_group(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                std::chrono::milliseconds, const std::string&) {
  no_gloo();
}

c10::intrusive_ptr<C10dBackend> make_gloo_subgroup(C10dBackend&, const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                   std::chrono::milliseconds) {
  no_gloo();
}

#endif

}  // namespace ptrain::compat
