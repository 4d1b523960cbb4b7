#include "ptrain/train/checkpoint_staging.h"

#include <algorithm>

namespace ptrain::train {

const char* to_string(StagingPlace place) { return place == StagingPlace::device ? "device" : "host"; }

bool device_snapshot_fits(int64_t snapshot_bytes, int64_t free_bytes, int64_t total_bytes) {
  const auto headroom = std::max(kSnapshotHeadroomMinBytes, static_cast<int64_t>(kSnapshotHeadroomFraction * total_bytes));
  return snapshot_bytes + headroom <= free_bytes;
}

}  // namespace ptrain::train
