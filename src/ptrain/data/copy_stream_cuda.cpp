// CUDA builds: copy streams from c10's stream pool, fences on CUDA events.
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "ptrain/data/copy_stream.h"

namespace ptrain::data {

namespace {

class CudaCopyFence final : public CopyFence {
 public:
  explicit CudaCopyFence(const c10::cuda::CUDAStream& stream) { copied_.record(stream); }
  void hand_over(const std::vector<torch::Tensor>& tensors) override {
    const auto consumer = c10::cuda::getCurrentCUDAStream(copied_.device_index());
    copied_.block(consumer);
    for (const auto& t : tensors) t.record_stream(consumer);
  }

 private:
  at::cuda::CUDAEvent copied_;
};

class CudaCopyStream final : public CopyStream {
 public:
  explicit CudaCopyStream(c10::DeviceIndex device)
      : stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device)) {}
  torch::Device device() const override { return stream_.device(); }
  std::shared_ptr<void> make_current() override { return std::make_shared<c10::cuda::CUDAStreamGuard>(stream_); }
  std::unique_ptr<CopyFence> fence() override { return std::make_unique<CudaCopyFence>(stream_); }

 private:
  c10::cuda::CUDAStream stream_;
};

}  // namespace

std::unique_ptr<CopyStream> make_copy_stream(const torch::Device& device) {
  return std::make_unique<CudaCopyStream>(device.has_index() ? device.index() : c10::cuda::current_device());
}

}  // namespace ptrain::data
