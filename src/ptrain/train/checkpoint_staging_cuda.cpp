// CUDA builds: a device snapshot copied to pinned host memory by the writer thread, or pinned host memory
// directly where the device has no room for a snapshot.
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "ptrain/core/error.h"
#include "ptrain/metrics/timer.h"
#include "ptrain/train/checkpoint_staging.h"

namespace ptrain::train {

namespace {

torch::Tensor empty_pinned_like(const torch::Tensor& tensor) {
  return torch::empty(tensor.sizes(), tensor.options().device(torch::kCPU).pinned_memory(true));
}

// A tensor shaped as `like` over bytes at `at`, which holds `keep` alive (a flat buffer's view).
torch::Tensor view_over(void* at, const torch::Tensor& like, torch::Device device, std::function<void()> keep) {
  return torch::from_blob(at, like.sizes(), [keep = std::move(keep)](void*) {}, like.options().device(device));
}

// How long one device-to-host copy of a flat snapshot is. Few, large copies: each is a call to the driver from
// the writer thread, beside a training thread that calls it for every step; 1,300 per-tensor copies of GPT-2
// large's state spent seconds queueing there (docs/results/2026-12-06-gpu-async-checkpoint.md). Small enough
// that the file writers start on the first bytes within milliseconds (about 50 GB/s into pinned memory).
constexpr int64_t kCopyPieceBytes = int64_t{512} << 20;

// A device's share of the snapshot: one flat buffer holding its tensors one after another, each at an offset
// aligned to kStagingAlignment, in the order the sections give them.
struct FlatSnapshot {
  torch::Tensor bytes;  // uint8 on the device
  int64_t size = 0;
};

// The snapshot, taken on each device's current stream (so after every step queued before, before every update
// queued after), and the event each device recorded after it. The host block mirrors the flat buffers one
// after another in device order, so that each piece of a buffer is one copy into one range of the block.
class DeviceSnapshot final : public StagedSections {
 public:
  DeviceSnapshot(std::vector<io::NamedTensors> sections, std::map<c10::DeviceIndex, FlatSnapshot> flats,
                 std::map<c10::DeviceIndex, std::shared_ptr<at::cuda::CUDAEvent>> taken,
                 std::shared_ptr<HostStagingArea> area)
      : sections_(std::move(sections)), flats_(std::move(flats)), taken_(std::move(taken)), area_(std::move(area)) {}

  // The snapshot's memory goes back to the allocator only once every copy that reads it is done, so nothing
  // else can be handed it while they do: a write that failed half way still waits here.
  ~DeviceSnapshot() override {
    for (const auto& arrived : arrivals_) arrived->synchronize();
  }

  // The writer thread's half: device to pinned host on a stream of each device's own, ordered after the
  // snapshot, beside the steps that train meanwhile, in pieces of kCopyPieceBytes. An event after each piece
  // tells the writer's threads which bytes have arrived, so that the checksum and the file's writes follow the
  // copies instead of waiting for the last of them.
  std::vector<io::NamedTensors> begin_host_copies() override {
    const int64_t total = device_bytes();
    std::shared_ptr<char> block;
    if (area_) {
      block = area_->block(total);
    } else {
      auto pinned = torch::empty({std::max<int64_t>(total, 1)}, torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true));
      block = std::shared_ptr<char>(static_cast<char*>(pinned.data_ptr()), [pinned](char*) {});
    }
    std::map<c10::DeviceIndex, char*> host_of;
    int64_t host_offset = 0;
    for (const auto& [device, flat] : flats_) {
      host_of[device] = block.get() + host_offset;
      const c10::cuda::CUDAGuard on_device(device);
      const auto stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device);
      taken_.at(device)->block(stream);
      const auto* from = static_cast<const char*>(flat.bytes.data_ptr());
      for (int64_t offset = 0; offset < flat.size; offset += kCopyPieceBytes) {
        const int64_t piece = std::min(kCopyPieceBytes, flat.size - offset);
        char* to = host_of[device] + offset;
        C10_CUDA_CHECK(cudaMemcpyAsync(to, from + offset, static_cast<size_t>(piece), cudaMemcpyDeviceToHost, stream));
        arrivals_.push_back(std::make_shared<at::cuda::CUDAEvent>());
        arrivals_.back()->record(stream);
        arrival_of_.emplace(to, Arrival{to + piece, arrivals_.size() - 1});
      }
      host_offset += flat.size;
    }
    for (auto& section : sections_)
      for (auto& [name, tensor] : section) {
        if (!tensor.defined() || !tensor.is_cuda()) continue;
        const auto device = tensor.device().index();
        const auto offset = static_cast<const char*>(tensor.data_ptr()) -
                            static_cast<const char*>(flats_.at(device).bytes.data_ptr());
        tensor = view_over(host_of.at(device) + offset, tensor, torch::kCPU, [block] {});
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
  int64_t device_bytes() const override {
    int64_t bytes = 0;
    for (const auto& [device, flat] : flats_) bytes += flat.size;
    return bytes;
  }

 private:
  struct Arrival {
    const char* end;  // of the piece's host bytes
    size_t event;     // in arrivals_: recorded once they have arrived
  };
  std::vector<io::NamedTensors> sections_;  // views of flats_ until begin_host_copies()
  std::map<c10::DeviceIndex, FlatSnapshot> flats_;
  std::map<c10::DeviceIndex, std::shared_ptr<at::cuda::CUDAEvent>> taken_;
  std::vector<std::shared_ptr<at::cuda::CUDAEvent>> arrivals_;
  std::map<const char*, Arrival> arrival_of_;  // by the first byte of each piece
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

// Copies every CUDA tensor of sections into its device's flat buffer (a device-to-device copy each, queued on the
// device's current stream) and replaces it by its view there; host tensors are cloned.
std::unique_ptr<StagedSections> snapshot_on_devices(std::vector<io::NamedTensors> sections,
                                                    std::shared_ptr<HostStagingArea> area) {
  std::map<c10::DeviceIndex, FlatSnapshot> flats;
  for (const auto& section : sections)
    for (const auto& [name, tensor] : section)
      if (tensor.defined() && tensor.is_cuda())
        flats[tensor.device().index()].size += staged_size(tensor);
  for (auto& [device, flat] : flats)
    flat.bytes = torch::empty({flat.size}, torch::TensorOptions().dtype(torch::kUInt8).device(torch::kCUDA, device));
  std::map<c10::DeviceIndex, int64_t> filled;
  for (auto& section : sections)
    for (auto& [name, tensor] : section) {
      if (!tensor.defined()) continue;
      if (!tensor.is_cuda()) {
        tensor = tensor.detach().clone();
        continue;
      }
      const auto device = tensor.device().index();
      auto& flat = flats.at(device);
      auto& offset = filled[device];
      auto slot = view_over(static_cast<char*>(flat.bytes.data_ptr()) + offset, tensor, tensor.device(),
                            [keep = flat.bytes] {});
      slot.copy_(tensor.detach());
      offset += staged_size(tensor);
      tensor = std::move(slot);
    }
  std::map<c10::DeviceIndex, std::shared_ptr<at::cuda::CUDAEvent>> taken;
  for (const auto& [device, flat] : flats) {
    auto event = std::make_shared<at::cuda::CUDAEvent>();
    event->record(c10::cuda::getCurrentCUDAStream(device));
    taken.emplace(device, std::move(event));
  }
  return std::make_unique<DeviceSnapshot>(std::move(sections), std::move(flats), std::move(taken), std::move(area));
}

}  // namespace

std::shared_ptr<char> pin_host_bytes(int64_t bytes) {
  // Not cudaHostAlloc: it faults and pins the pages one by one inside the driver, 3.2 s for 9.4 GB on the H100
  // host of docs/results/2026-12-06-gpu-async-checkpoint.md (pin_probe.py), while the training thread's launches
  // wait for the driver. Pages faulted in by several threads first, then registered, took 0.6 s + 0.4 s there.
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t size = (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + page - 1) / page * page;
  void* memory = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  check(memory != MAP_FAILED, "--async-checkpoint: could not map " + std::to_string(size >> 20) +
                                  " MiB of host memory to stage checkpoints in: " + std::strerror(errno));
  const size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency() / 2, 1, 8);
  const size_t pages = size / page, share = (pages + threads - 1) / threads;
  std::vector<std::thread> touching;
  for (size_t t = 0; t < threads; ++t)
    touching.emplace_back([=] {
      auto* bytes_of = static_cast<volatile char*>(memory);
      for (size_t p = t * share; p < std::min(pages, (t + 1) * share); ++p) bytes_of[p * page] = 0;
    });
  for (auto& thread : touching) thread.join();
  // Portable: pinned for every device's context, so that each device of a dp process copies into it by DMA.
  const cudaError_t registered = cudaHostRegister(memory, size, cudaHostRegisterPortable);
  if (registered != cudaSuccess) {
    ::munmap(memory, size);
    C10_CUDA_CHECK(registered);
  }
  return std::shared_ptr<char>(static_cast<char*>(memory), [size](char* p) {
    cudaHostUnregister(p);
    ::munmap(p, size);
  });
}

std::vector<io::NamedTensors> copy_to_pinned_host(std::vector<io::NamedTensors> sections, HostStagingArea& area) {
  const auto bytes = bytes_by_device(sections);
  if (bytes.empty()) return sections;
  const std::shared_ptr<char> block = area.block(staging_bytes(sections));
  int64_t offset = 0;
  for (auto& section : sections)
    for (auto& [name, tensor] : section) {
      if (!tensor.defined() || !tensor.is_cuda()) continue;
      auto host = view_over(block.get() + offset, tensor, torch::kCPU, [block] {});
      host.copy_(tensor.detach(), /*non_blocking=*/true);
      offset += staged_size(tensor);
      tensor = std::move(host);
    }
  for (const auto& [device, size] : bytes) metrics::synchronize(torch::Device(torch::kCUDA, device));
  return sections;
}

std::unique_ptr<StagedSections> stage_sections(std::vector<io::NamedTensors> sections,
                                               std::shared_ptr<HostStagingArea> area) {
  const auto bytes = bytes_by_device(sections);
  if (!bytes.empty() && snapshot_fits(bytes)) return snapshot_on_devices(std::move(sections), std::move(area));
  for (auto& section : sections)
    for (auto& [name, tensor] : section) {
      if (!tensor.defined()) continue;
      if (!tensor.is_cuda()) {
        tensor = tensor.detach().clone();
      } else {
        // Pinned: the copy runs as a DMA at the link's full speed, as PyTorch DCP's async_save stages.
        auto host = empty_pinned_like(tensor);
        host.copy_(tensor.detach(), /*non_blocking=*/true);
        tensor = std::move(host);
      }
    }
  // The copies are queued on each device's current stream; the writer thread may read them only once done.
  for (const auto& [device, size] : bytes) metrics::synchronize(torch::Device(torch::kCUDA, device));
  return std::make_unique<StagedOnHost>(std::move(sections));
}

}  // namespace ptrain::train
