// CUDA builds: the lanes are streams from c10's pool, fenced by CUDA events; the CPU's are no-ops.
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "ptrain/distributed/comm_streams.h"

namespace ptrain::distributed {

namespace {

class CudaCommStreams final : public CommStreams {
 public:
  explicit CudaCommStreams(c10::DeviceIndex device)
      : device_(device),
        reduce_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device)),
        gather_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device)) {}

  std::shared_ptr<void> after_compute(CommLane lane) override {
    at::cuda::CUDAEvent computed;
    computed.record(c10::cuda::getCurrentCUDAStream(device_));
    computed.block(stream(lane));
    return on(lane);
  }
  std::shared_ptr<void> on(CommLane lane) override { return std::make_shared<c10::cuda::CUDAStreamGuard>(stream(lane)); }
  void compute_waits(CommLane lane) override {
    at::cuda::CUDAEvent done;
    done.record(stream(lane));
    done.block(c10::cuda::getCurrentCUDAStream(device_));
  }
  bool orders_streams() const override { return true; }

 private:
  const c10::cuda::CUDAStream& stream(CommLane lane) const { return lane == CommLane::reduce ? reduce_ : gather_; }

  c10::DeviceIndex device_;
  c10::cuda::CUDAStream reduce_, gather_;
};

}  // namespace

std::shared_ptr<CommStreams> make_comm_streams(const torch::Device& device) {
  if (!device.is_cuda()) return std::make_shared<HostOrderedStreams>();
  return std::make_shared<CudaCommStreams>(device.has_index() ? device.index() : c10::cuda::current_device());
}

}  // namespace ptrain::distributed
