// The compatibility layer's CPU-build half. Debian's CPU LibTorch 1.13 has no Kineto (its Kineto API records
// but cannot save), so traces hold the CPU operators of the legacy profiler; there is no CUDA allocator.
#include <torch/csrc/autograd/profiler_legacy.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "ptrain/core/error.h"
#include "ptrain/core/profiler_session.h"
#include "ptrain/core/torch_compat.h"

namespace ptrain::compat {

namespace profiler_session {

namespace {

struct LegacyRecording {
  std::ostringstream events;
  std::unique_ptr<torch::autograd::profiler::RecordProfile> recorder;
};

LegacyRecording& recording() {
  static LegacyRecording state;
  return state;
}

}  // namespace

void start(bool) {
  auto& state = recording();
  state.events.str("");
  state.recorder = std::make_unique<torch::autograd::profiler::RecordProfile>(state.events);
}

void stop_into(const std::string& file) {
  auto& state = recording();
  state.recorder.reset();  // writes the events
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out << state.events.str();
  out.flush();
  check(static_cast<bool>(out), "cannot write " + file);
}

}  // namespace profiler_session

CudaAllocatorPeaks cuda_allocator_peaks(int device) {
  throw Error("cuda:" + std::to_string(device) + " allocator statistics: this ptrain was built without CUDA");
}

void reset_cuda_allocator_peaks(int device) {
  throw Error("cuda:" + std::to_string(device) + " allocator statistics: this ptrain was built without CUDA");
}

bool nccl_broadcast_from_first(std::vector<torch::Tensor>&) { return false; }
bool nccl_reduce_into_first(std::vector<torch::Tensor>&) { return false; }

}  // namespace ptrain::compat
