// A named range on the profiler's timeline while it lives: LibTorch's RecordFunction in the user scope, the
// way Python's torch.profiler marks "ProfilerStep#N" and "Optimizer.step#SGD.step" (record_function). Both
// of ptrain's profilers (Kineto in CUDA builds, the legacy one in CPU builds, core/profiler_session.h)
// record it; with no profiler running it records nothing. The calls it makes are the same in LibTorch 1.13
// and 2.x (RecordFunction(RecordScope), isActive(), before(std::string)); a release that differs would be
// handled in torch_compat.h.
#pragma once

#include <memory>
#include <string>

namespace at {
struct RecordFunction;
}

namespace ptrain::compat {

class ProfilerRange {
 public:
  explicit ProfilerRange(const std::string& name);
  ~ProfilerRange();
  ProfilerRange(const ProfilerRange&) = delete;
  ProfilerRange& operator=(const ProfilerRange&) = delete;

 private:
  std::unique_ptr<at::RecordFunction> record_;
};

}  // namespace ptrain::compat
