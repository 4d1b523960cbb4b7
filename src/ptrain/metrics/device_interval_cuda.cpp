// CUDA builds: intervals on CUDA events. Inside a CUDA graph capture an ordinary event record only orders
// the graph; cudaEventRecordExternal makes it a node that records the event at every replay, so a captured
// step's phases stay measurable.
#include <cuda_runtime_api.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "ptrain/core/error.h"
#include "ptrain/metrics/step_phases.h"

namespace ptrain::metrics {

namespace {

void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(std::string("step phase timer: ") + what + ": " + cudaGetErrorString(status));
}

class CudaInterval final : public DeviceInterval {
 public:
  explicit CudaInterval(c10::DeviceIndex device) : device_(device) {
    c10::cuda::CUDAGuard guard(device_);
    cuda_check(cudaEventCreate(&begin_), "cudaEventCreate");
    cuda_check(cudaEventCreate(&end_), "cudaEventCreate");
  }
  ~CudaInterval() override {
    cudaEventDestroy(begin_);
    cudaEventDestroy(end_);
  }
  void begin() override { record(begin_); }
  void end() override { record(end_); }
  double seconds() override {
    cuda_check(cudaEventSynchronize(end_), "cudaEventSynchronize");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, begin_, end_), "cudaEventElapsedTime");
    return static_cast<double>(ms) / 1000.0;
  }

 private:
  void record(cudaEvent_t event) {
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device_).stream();
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cuda_check(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
    cuda_check(capture == cudaStreamCaptureStatusActive ? cudaEventRecordWithFlags(event, stream, cudaEventRecordExternal)
                                                        : cudaEventRecord(event, stream),
               "cudaEventRecord");
  }

  c10::DeviceIndex device_;
  cudaEvent_t begin_ = nullptr, end_ = nullptr;
};

}  // namespace

std::unique_ptr<DeviceInterval> make_device_interval(const torch::Device& device) {
  if (!device.is_cuda()) return nullptr;
  return std::make_unique<CudaInterval>(device.has_index() ? device.index() : c10::cuda::current_device());
}

}  // namespace ptrain::metrics
