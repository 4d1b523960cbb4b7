// CPU builds: a checkpoint's tensors are staged as clones, in the training thread.
#include "ptrain/core/error.h"
#include "ptrain/train/checkpoint_staging.h"

namespace ptrain::train {

std::shared_ptr<char> pin_host_bytes(int64_t) {
  throw Error("pinned host memory needs a ptrain built with CUDA");
}

std::vector<io::NamedTensors> copy_to_pinned_host(std::vector<io::NamedTensors> sections, HostStagingArea&) {
  return sections;  // no tensor of a CPU build is on a device
}

std::unique_ptr<StagedSections> stage_sections(std::vector<io::NamedTensors> sections, std::shared_ptr<HostStagingArea>) {
  for (auto& section : sections)
    for (auto& [name, tensor] : section) {
      if (!tensor.defined()) continue;
      check(!tensor.is_cuda(), "checkpoint tensor " + name + " is on a CUDA device in a ptrain built without CUDA");
      tensor = tensor.detach().clone();
    }
  return std::make_unique<StagedOnHost>(std::move(sections));
}

}  // namespace ptrain::train
