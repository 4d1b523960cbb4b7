// CUDA builds: a device snapshot copied to pinned host memory by the writer thread, or pinned host memory
// directly where the device has no room for a snapshot.
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include <torch/torch.h>

#include "ptrain/io/chunks.h"
#include "ptrain/metrics/timer.h"
#include "ptrain/train/checkpoint_staging.h"

namespace ptrain::train {

namespace {

torch::Tensor empty_pinned_like(const torch::Tensor& tensor) {
  return torch::empty(tensor.sizes(), tensor.options().device(torch::kCPU).pinned_memory(true));
}

// Host tensors for the CUDA tensors of sections, in order: views of one HostStagingArea block, each at an
// offset aligned as staging_bytes() counts, each holding the block.
class BlockViews {
 public:
  BlockViews(HostStagingArea& area, const std::vector<io::NamedTensors>& sections)
      : block_(area.block(staging_bytes(sections))) {}
  torch::Tensor like(const torch::Tensor& tensor) {
    const int64_t bytes = tensor.numel() * tensor.element_size();
    auto view = torch::from_blob(block_.get() + offset_, tensor.sizes(), [keep = block_](void*) {},
                                 tensor.options().device(torch::kCPU));
    offset_ += (bytes + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment;
    return view;
  }

 private:
  std::shared_ptr<char> block_;
  int64_t offset_ = 0;
};

// Device clones, taken on each device's current stream (so after every step queued before, before every
// update queued after), and the event each device recorded after them.
class DeviceSnapshot final : public StagedSections {
 public:
  DeviceSnapshot(std::vector<io::NamedTensors> sections, std::map<c10::DeviceIndex, std::shared_ptr<at::cuda::CUDAEvent>> taken,
                 int64_t bytes, std::shared_ptr<HostStagingArea> area)
      : sections_(std::move(sections)), taken_(std::move(taken)), bytes_(bytes), area_(std::move(area)) {}

  // The snapshot's memory goes back to the allocator only once every copy that reads it is done, so nothing
  // else can be handed it while they do: a write that failed half way still waits here.
  ~DeviceSnapshot() override {
    for (const auto& arrived : arrivals_) arrived->synchronize();
  }

  // The writer thread's half: device to pinned host on a stream of each device's own, ordered after the
  // snapshot, beside the steps that train meanwhile. An event after every io::kChunkBytes or so of copies
  // tells the writer's threads which bytes have arrived, so that the checksum and the file's writes follow
  // the copies instead of waiting for the last of them.
  std::vector<io::NamedTensors> begin_host_copies() override {
    std::optional<BlockViews> in_block;
    if (area_) in_block.emplace(*area_, sections_);
    for (const auto& [device, taken] : taken_) {
      const c10::cuda::CUDAGuard on_device(device);
      const auto stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device);
      taken->block(stream);
      const c10::cuda::CUDAStreamGuard on_stream(stream);
      size_t unmarked = 0;
      const auto mark_arrival = [&] {
        arrivals_.push_back(std::make_shared<at::cuda::CUDAEvent>());
        arrivals_.back()->record(stream);
        unmarked = 0;
      };
      for (auto& section : sections_)
        for (auto& [name, tensor] : section) {
          if (!tensor.defined() || !tensor.is_cuda() || tensor.device().index() != device) continue;
          auto host = in_block ? in_block->like(tensor) : empty_pinned_like(tensor);
          host.copy_(tensor, /*non_blocking=*/true);
          const size_t bytes = static_cast<size_t>(host.numel()) * host.element_size();
          const auto* begin = static_cast<const char*>(host.data_ptr());
          if (bytes > 0) arrival_of_.emplace(begin, Arrival{begin + bytes, arrivals_.size()});
          snapshots_.push_back(std::exchange(tensor, std::move(host)));
          unmarked += bytes;
          if (unmarked >= io::kChunkBytes) mark_arrival();
        }
      if (unmarked > 0) mark_arrival();
    }
    return std::move(sections_);
  }

  void wait_until_copied(const void* host_byte) const override {
    const auto* byte = static_cast<const char*>(host_byte);
    auto it = arrival_of_.upper_bound(byte);
    if (it == arrival_of_.begin()) return;
    --it;
    if (byte < it->second.end) arrivals_.at(it->second.event)->synchronize();
  }

  StagingPlace place() const override { return StagingPlace::device; }
  int64_t device_bytes() const override { return bytes_; }

 private:
  struct Arrival {
    const char* end;  // of the host tensor's bytes
    size_t event;     // in arrivals_: recorded once they have arrived
  };
  std::vector<io::NamedTensors> sections_;
  std::map<c10::DeviceIndex, std::shared_ptr<at::cuda::CUDAEvent>> taken_;
  std::vector<torch::Tensor> snapshots_;
  std::vector<std::shared_ptr<at::cuda::CUDAEvent>> arrivals_;
  std::map<const char*, Arrival> arrival_of_;  // by the first byte of each host tensor
  int64_t bytes_ = 0;
  std::shared_ptr<HostStagingArea> area_;
};

std::map<c10::DeviceIndex, int64_t> bytes_by_device(const std::vector<io::NamedTensors>& sections) {
  std::map<c10::DeviceIndex, int64_t> bytes;
  for (const auto& section : sections)
    for (const auto& [name, tensor] : section)
      if (tensor.defined() && tensor.is_cuda()) bytes[tensor.device().index()] += tensor.numel() * tensor.element_size();
  return bytes;
}

bool snapshot_fits(const std::map<c10::DeviceIndex, int64_t>& bytes) {
  for (const auto& [device, snapshot_bytes] : bytes) {
    const c10::cuda::CUDAGuard on_device(device);
    size_t free_bytes = 0, total_bytes = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (!device_snapshot_fits(snapshot_bytes, static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)))
      return false;
  }
  return true;
}

}  // namespace

std::shared_ptr<char> pin_host_bytes(int64_t bytes) {
  void* pinned = nullptr;
  // Portable: pinned for every device's context, so that each device of a dp process copies into it by DMA.
  C10_CUDA_CHECK(cudaHostAlloc(&pinned, static_cast<size_t>(std::max<int64_t>(bytes, 1)), cudaHostAllocPortable));
  return std::shared_ptr<char>(static_cast<char*>(pinned), [](char* p) { cudaFreeHost(p); });
}

std::unique_ptr<StagedSections> stage_sections(std::vector<io::NamedTensors> sections,
                                               std::shared_ptr<HostStagingArea> area) {
  const auto bytes = bytes_by_device(sections);
  const bool on_device = !bytes.empty() && snapshot_fits(bytes);
  int64_t device_bytes = 0;
  for (auto& section : sections)
    for (auto& [name, tensor] : section) {
      if (!tensor.defined()) continue;
      if (!tensor.is_cuda() || on_device) {
        tensor = tensor.detach().clone();
      } else {
        // Pinned: the copy runs as a DMA at the link's full speed, as PyTorch DCP's async_save stages.
        auto host = empty_pinned_like(tensor);
        host.copy_(tensor.detach(), /*non_blocking=*/true);
        tensor = std::move(host);
      }
    }
  if (!on_device) {
    // The copies are queued on each device's current stream; the writer thread may read them only once done.
    for (const auto& [device, size] : bytes) metrics::synchronize(torch::Device(torch::kCUDA, device));
    return std::make_unique<StagedOnHost>(std::move(sections));
  }
  std::map<c10::DeviceIndex, std::shared_ptr<at::cuda::CUDAEvent>> taken;
  for (const auto& [device, size] : bytes) {
    auto event = std::make_shared<at::cuda::CUDAEvent>();
    event->record(c10::cuda::getCurrentCUDAStream(device));
    taken.emplace(device, std::move(event));
    device_bytes += size;
  }
  return std::make_unique<DeviceSnapshot>(std::move(sections), std::move(taken), device_bytes, std::move(area));
}

}  // namespace ptrain::train
