// Where --async-checkpoint copies a checkpoint's tensors at the step boundary, before the background write:
// somewhere the next steps' in-place updates cannot reach. The training thread only begins the copy; the
// writer thread finishes it, so that the step waits for as little as the device allows.
//
// CUDA builds (checkpoint_staging_cuda.cpp): when the device has room for it, a snapshot on the device
// (a device-to-device copy at HBM speed, a few milliseconds a GB) that the writer thread then copies to
// pinned host memory on a stream of its own while training goes on; otherwise pinned host memory directly,
// which the training thread waits for (the link's speed: about a second for 20 GB). CPU builds
// (checkpoint_staging_none.cpp): clones. CMake picks the file, so that callers never ask which build they
// are in.
#pragma once

#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ptrain/io/named_tensors.h"

namespace ptrain::train {

// Headroom a device snapshot leaves free on its device: the steps that run beside the copy may still grow
// (an eager step's transient buffers, the allocator's rounding), and an out-of-memory error there would cost
// the run rather than a slower save.
inline constexpr double kSnapshotHeadroomFraction = 0.05;
inline constexpr int64_t kSnapshotHeadroomMinBytes = int64_t{1} << 30;

// Where a staged copy was taken.
enum class StagingPlace { host, device };
const char* to_string(StagingPlace place);

// The copies of one checkpoint's sections: begun by stage_sections() in the training thread, brought to host
// memory by the writer thread.
class StagedSections {
 public:
  virtual ~StagedSections() = default;
  // The sections as host tensors, in the order given, whose bytes become equal to the originals at the moment
  // they were staged as the copies to host memory arrive: read a tensor's bytes only after
  // wait_until_copied() of them. The file is written while the later tensors are still on their way. Call
  // once.
  virtual std::vector<io::NamedTensors> begin_host_copies() = 0;
  // Blocks until the host bytes at `host_byte` (in a tensor begin_host_copies() returned) hold their copy;
  // at once for bytes of no copy in flight. Safe from several threads at once.
  virtual void wait_until_copied(const void* host_byte) const = 0;
  virtual StagingPlace place() const = 0;
  // The bytes staged on devices (0 on the CPU).
  virtual int64_t device_bytes() const = 0;

  // begin_host_copies() with every copy arrived.
  std::vector<io::NamedTensors> finish();
};

// Host copies complete when staged: the calling thread made them, or waited for them (both builds' halves).
class StagedOnHost final : public StagedSections {
 public:
  explicit StagedOnHost(std::vector<io::NamedTensors> sections) : sections_(std::move(sections)) {}
  std::vector<io::NamedTensors> begin_host_copies() override { return std::move(sections_); }
  void wait_until_copied(const void*) const override {}
  StagingPlace place() const override { return StagingPlace::host; }
  int64_t device_bytes() const override { return 0; }

 private:
  std::vector<io::NamedTensors> sections_;
};

// Pinned host memory that device snapshots are copied into, kept from one save to the next. Pinning takes
// seconds for gigabytes (docs/results/2026-12-06-gpu-async-checkpoint.md: the first background write of GPT-2
// large's 9.4 GB took 6 s longer than the next ones), which the first write would pay while the next save
// waits for it; reserve() pays it in the background before the first save. One block for the whole state:
// PyTorch's caching host allocator would round each tensor up to a power of two, up to twice the memory.
class HostStagingArea {
 public:
  HostStagingArea() = default;
  ~HostStagingArea();
  HostStagingArea(const HostStagingArea&) = delete;
  HostStagingArea& operator=(const HostStagingArea&) = delete;

  // Begins pinning a block for sections like these (their tensors on CUDA devices) and kStagingSlackBytes more,
  // on a thread of its own. Nothing when none is on a CUDA device (CPU runs, CPU builds).
  void reserve(const std::vector<io::NamedTensors>& sections);
  // A pinned block of at least bytes: reserve()'s once pinned, or a larger one pinned now. Its memory is
  // reused by the next call: views of it must be done with by then (one checkpoint write at a time).
  std::shared_ptr<char> block(int64_t bytes);

  // Each block pinned, in order: its size, how long pinning it took, and whether reserve() pinned it (beside
  // the steps) or block() did (while its caller waited).
  struct Pinning {
    int64_t bytes = 0;
    double seconds = 0;
    bool reserved = false;
  };
  std::vector<Pinning> pinnings();

 private:
  std::mutex mutex_;
  std::shared_ptr<char> block_;
  int64_t bytes_ = 0;
  std::future<std::shared_ptr<char>> pinning_;
  int64_t pinning_bytes_ = 0;
  std::mutex pinnings_mutex_;
  std::vector<Pinning> pinnings_;
};

// Room a reserved block keeps beyond the sections reserved for: a save also stages small tensors the caller may
// not reserve for (the progress totals, which take a collective to read). Without it, the first save found the
// block reserved for GPT-2 large's 9.4 GB a few hundred bytes short and pinned it again while the steps waited
// (docs/results/2026-12-06-gpu-async-checkpoint.md, call 9).
inline constexpr int64_t kStagingSlackBytes = int64_t{1} << 20;
// The bytes a HostStagingArea block needs for the CUDA tensors of sections: each at an offset aligned to
// kStagingAlignment, in order.
inline constexpr int64_t kStagingAlignment = 256;
int64_t staging_bytes(const std::vector<io::NamedTensors>& sections);
// The bytes one tensor takes there: its own, rounded up to kStagingAlignment.
int64_t staged_size(const torch::Tensor& tensor);
// `bytes` of pinned host memory (the CUDA build's, registered portable to every device); the CPU build has none
// to give and throws.
std::shared_ptr<char> pin_host_bytes(int64_t bytes);

// The sections with each CUDA tensor copied into area's pinned block, the others as they are: a synchronous
// save's copy, which the calling thread waits for. Into pageable memory, GPT-2 large's 9.4 GB took 6 s (about
// 1.5 GB/s); into pinned memory, the link's 50 GB/s. The block is reused by the next call.
std::vector<io::NamedTensors> copy_to_pinned_host(std::vector<io::NamedTensors> sections, HostStagingArea& area);

// Begins copying sections. Later in-place updates of the originals, queued on the devices' current streams
// after this returns, never reach the copies. A device snapshot is copied into area's block when one is given,
// else into pinned memory of PyTorch's caching host allocator.
std::unique_ptr<StagedSections> stage_sections(std::vector<io::NamedTensors> sections,
                                               std::shared_ptr<HostStagingArea> area = nullptr);

// Whether a device snapshot of snapshot_bytes fits beside what the device holds: free_bytes (the driver's)
// less the headroom of a device of total_bytes.
bool device_snapshot_fits(int64_t snapshot_bytes, int64_t free_bytes, int64_t total_bytes);

}  // namespace ptrain::train
