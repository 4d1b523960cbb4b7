// The parts of the compatibility layer too heavy for its header: the profiler's headers.
#include "ptrain/core/torch_compat.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "ptrain/core/error.h"

#if PTRAIN_WITH_CUDA
#include <torch/csrc/autograd/profiler_kineto.h>
#else
#include <torch/csrc/autograd/profiler_legacy.h>
#endif

namespace ptrain::compat {

namespace {

struct TraceState {
  bool running = false;
  std::string path;
#if !PTRAIN_WITH_CUDA
  std::ostringstream events;
  std::unique_ptr<torch::autograd::profiler::RecordProfile> recorder;
#endif
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

}  // namespace

void start_profiler_trace(bool with_cuda, const std::string& path) {
  auto& state = trace_state();
  check(!state.running, "profiler: a trace is already running");
  state.path = path;
#if PTRAIN_WITH_CUDA
  namespace profiler = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (with_cuda) activities.insert(ActivityType::CUDA);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
#else
  (void)with_cuda;
  state.events.str("");
  state.recorder = std::make_unique<torch::autograd::profiler::RecordProfile>(state.events);
#endif
  state.running = true;
}

void stop_profiler_trace() {
  auto& state = trace_state();
  check(state.running, "profiler: no trace is running");
  state.running = false;
  const std::string temporary = temporary_beside(state.path);
#if PTRAIN_WITH_CUDA
  auto result = torch::autograd::profiler::disableProfiler();
  try {
    result->save(temporary);
  } catch (const c10::Error& e) {
    std::remove(temporary.c_str());
    throw Error("--profile-out " + state.path + ": the trace could not be written: " + e.what_without_backtrace());
  }
#else
  state.recorder.reset();  // writes the events
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << state.events.str();
    out.flush();
    if (!out) {
      std::remove(temporary.c_str());
      throw Error("--profile-out " + state.path + ": cannot write the trace there");
    }
  }
#endif
  rename_into_place(temporary, state.path);
}

}  // namespace ptrain::compat
