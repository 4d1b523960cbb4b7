#include "ptrain/train/checkpoint_staging.h"

#include <algorithm>

namespace ptrain::train {

const char* to_string(StagingPlace place) { return place == StagingPlace::device ? "device" : "host"; }

std::vector<io::NamedTensors> StagedSections::finish() {
  std::vector<io::NamedTensors> sections = begin_host_copies();
  for (const auto& section : sections)
    for (const auto& [name, tensor] : section)
      if (tensor.defined() && tensor.numel() > 0) wait_until_copied(tensor.data_ptr());
  return sections;
}

bool device_snapshot_fits(int64_t snapshot_bytes, int64_t free_bytes, int64_t total_bytes) {
  const auto headroom = std::max(kSnapshotHeadroomMinBytes, static_cast<int64_t>(kSnapshotHeadroomFraction * total_bytes));
  return snapshot_bytes + headroom <= free_bytes;
}

}  // namespace ptrain::train
