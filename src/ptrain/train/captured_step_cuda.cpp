// CUDA builds: the step as an at::cuda::CUDAGraph. The capture runs in thread-local mode: the data loader's
// thread keeps copying batches on its own stream meanwhile, which global mode would refuse; the autograd
// engine's backward thread launches onto the capturing stream, so its kernels are recorded all the same.
// A capture that fails stops the run with CUDA's reason: the step it was recording never ran, and a
// half-ended capture leaves nothing to continue from safely.
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <optional>

#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/train/captured_step.h"

namespace ptrain::train {

namespace {

// `waiter`'s later work runs after what `on` was given so far (nothing to do when they are one stream).
void order_after(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& on) {
  if (waiter == on) return;
  at::cuda::CUDAEvent event;
  event.record(on);
  event.block(waiter);
}

class CudaCapturedStep final : public CapturedStep {
 public:
  // Captures on the current stream unless it is the legacy default stream, on which CUDA captures nothing.
  explicit CudaCapturedStep(c10::DeviceIndex device) : device_(device), side_(capture_stream(device)) {}

  void run_on_capture_stream(const std::function<void()>& fn) override {
    c10::cuda::CUDAGuard device_guard(device_);
    const auto current = c10::cuda::getCurrentCUDAStream(device_);
    order_after(side_, current);
    {
      c10::cuda::CUDAStreamGuard on_side(side_);
      fn();
    }
    order_after(current, side_);
  }

  void capture(const std::function<void()>& fn) override {
    c10::cuda::CUDAGuard device_guard(device_);
    const auto current = c10::cuda::getCurrentCUDAStream(device_);
    order_after(side_, current);
    // The graph allocates from a pool of its own. The eager steps before it left their activations' and
    // cuDNN's autotuning workspaces' blocks cached in the default pool, where nothing would use them again:
    // kept, they held as much device memory beside the graph's pool as the step itself (ResNet-50 amp-bf16
    // on an H200: 12.2 GiB reserved for 4.6 GiB allocated). Returned to the driver once, before the capture.
    c10::cuda::CUDACachingAllocator::emptyCache();
    try {
      c10::cuda::CUDAStreamGuard on_side(side_);
      compat::begin_thread_local_capture(graph_);
      try {
        fn();
      } catch (...) {
        end_failed_capture();
        throw;
      }
      graph_.capture_end();
    } catch (const c10::Error& e) {
      throw Error(std::string("CUDA graph capture failed (rerun with --no-cuda-graphs to train without): ") +
                  e.what_without_backtrace());
    }
    order_after(current, side_);
    captured_ = true;
  }

  void replay() override {
    check(captured_, "CUDA graph: replay() before a successful capture(), or after release()");
    graph_.replay();
  }

  void release() override {
    if (!captured_) return;
    c10::cuda::CUDAGuard device_guard(device_);
    c10::cuda::device_synchronize();  // the pool's memory goes only once no replay reads it
    graph_.reset();
    captured_ = false;
    // Blocks still in use (the gradients the graph allocated) stay; the rest of the pool goes back.
    c10::cuda::CUDACachingAllocator::emptyCache();
  }

 private:
  static c10::cuda::CUDAStream capture_stream(c10::DeviceIndex device) {
    const auto current = c10::cuda::getCurrentCUDAStream(device);
    return current == c10::cuda::getDefaultCUDAStream(device) ? c10::cuda::getStreamFromPool(false, device) : current;
  }

  // A capture interrupted by an exception is still ended (the stream would stay in capture mode); the run
  // then stops with the first error.
  void end_failed_capture() {
    try {
      graph_.capture_end();
    } catch (const c10::Error&) {
    }
    (void)cudaGetLastError();
  }

  c10::DeviceIndex device_;
  c10::cuda::CUDAStream side_;
  at::cuda::CUDAGraph graph_;
  bool captured_ = false;
};

class CudaRunStream final : public RunStream {
 public:
  explicit CudaRunStream(c10::DeviceIndex device)
      : before_(c10::cuda::getCurrentCUDAStream(device)), run_(c10::cuda::getStreamFromPool(false, device)) {
    order_after(run_, before_);
    guard_.emplace(run_);
  }
  ~CudaRunStream() override {
    guard_.reset();
    order_after(before_, run_);
  }

 private:
  c10::cuda::CUDAStream before_, run_;
  std::optional<c10::cuda::CUDAStreamGuard> guard_;
};

}  // namespace

std::unique_ptr<RunStream> use_run_stream(const torch::Device& device) {
  if (!device.is_cuda()) return nullptr;
  return std::make_unique<CudaRunStream>(device.has_index() ? device.index() : c10::cuda::current_device());
}

std::unique_ptr<CapturedStep> make_captured_step(const torch::Device& device) {
  if (!device.is_cuda()) return nullptr;
  return std::make_unique<CudaCapturedStep>(device.has_index() ? device.index() : c10::cuda::current_device());
}

}  // namespace ptrain::train
