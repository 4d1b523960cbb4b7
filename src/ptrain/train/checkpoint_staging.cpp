#include "ptrain/train/checkpoint_staging.h"

#include <algorithm>
#include <exception>

#include "ptrain/metrics/timer.h"

namespace ptrain::train {

const char* to_string(StagingPlace place) { return place == StagingPlace::device ? "device" : "host"; }

std::vector<io::NamedTensors> StagedSections::finish() {
  std::vector<io::NamedTensors> sections = begin_host_copies();
  for (const auto& section : sections)
    for (const auto& [name, tensor] : section)
      if (tensor.defined() && tensor.numel() > 0) wait_until_copied(tensor.data_ptr());
  return sections;
}

int64_t staging_bytes(const std::vector<io::NamedTensors>& sections) {
  int64_t bytes = 0;
  for (const auto& section : sections)
    for (const auto& [name, tensor] : section)
      if (tensor.defined() && tensor.is_cuda()) bytes += staged_size(tensor);
  return bytes;
}

int64_t staged_size(const torch::Tensor& tensor) {
  return (tensor.numel() * tensor.element_size() + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment;
}

HostStagingArea::~HostStagingArea() {
  if (pinning_.valid()) pinning_.wait();
}

void HostStagingArea::reserve(const std::vector<io::NamedTensors>& sections) {
  const int64_t staged = staging_bytes(sections);
  if (staged == 0) return;
  const int64_t bytes = staged + kStagingSlackBytes;
  const std::lock_guard<std::mutex> lock(mutex_);
  if (bytes <= bytes_ || (pinning_.valid() && bytes <= pinning_bytes_)) return;
  if (pinning_.valid()) pinning_.wait();
  pinning_bytes_ = bytes;
  pinning_ = std::async(std::launch::async, [this, bytes] {
    const metrics::Stopwatch clock;
    auto pinned = pin_host_bytes(bytes);
    const std::lock_guard<std::mutex> lock(pinnings_mutex_);  // not mutex_: block() holds it while it waits here
    pinnings_.push_back({bytes, clock.elapsed_seconds(), true});
    return pinned;
  });
}

std::shared_ptr<char> HostStagingArea::block(int64_t bytes) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (pinning_.valid()) {
    // A pinning that failed is not the save's failure: the block is pinned again below, and its error, if it
    // is the memory's, comes from there.
    try {
      auto pinned = pinning_.get();
      if (pinning_bytes_ > bytes_) {
        block_ = std::move(pinned);
        bytes_ = pinning_bytes_;
      }
    } catch (const std::exception&) {
    }
  }
  if (bytes > bytes_) {
    block_.reset();  // unpinned before the larger one is pinned
    const metrics::Stopwatch clock;
    block_ = pin_host_bytes(bytes);
    bytes_ = bytes;
    const std::lock_guard<std::mutex> pinnings_lock(pinnings_mutex_);
    pinnings_.push_back({bytes, clock.elapsed_seconds(), false});
  }
  return block_;
}

std::vector<HostStagingArea::Pinning> HostStagingArea::pinnings() {
  const std::lock_guard<std::mutex> lock(pinnings_mutex_);
  return pinnings_;
}

bool device_snapshot_fits(int64_t snapshot_bytes, int64_t free_bytes, int64_t total_bytes) {
  const auto headroom = std::max(kSnapshotHeadroomMinBytes, static_cast<int64_t>(kSnapshotHeadroomFraction * total_bytes));
  return snapshot_bytes + headroom <= free_bytes;
}

}  // namespace ptrain::train
