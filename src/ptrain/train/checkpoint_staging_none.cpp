// CPU builds: a checkpoint's tensors are staged as clones, in the training thread.
#include "ptrain/core/error.h"
#include "ptrain/train/checkpoint_staging.h"

namespace ptrain::train {

namespace {

class HostClones final : public StagedSections {
 public:
  explicit HostClones(std::vector<io::NamedTensors> sections) : sections_(std::move(sections)) {}
  std::vector<io::NamedTensors> finish() override { return std::move(sections_); }
  StagingPlace place() const override { return StagingPlace::host; }
  int64_t device_bytes() const override { return 0; }

 private:
  std::vector<io::NamedTensors> sections_;
};

}  // namespace

std::unique_ptr<StagedSections> stage_sections(std::vector<io::NamedTensors> sections) {
  for (auto& section : sections)
    for (auto& [name, tensor] : section) {
      if (!tensor.defined()) continue;
      check(!tensor.is_cuda(), "checkpoint tensor " + name + " is on a CUDA device in a ptrain built without CUDA");
      tensor = tensor.detach().clone();
    }
  return std::make_unique<HostClones>(std::move(sections));
}

}  // namespace ptrain::train
