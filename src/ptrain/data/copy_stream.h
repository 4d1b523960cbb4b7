// Where the loader's host-to-device copies run: a CUDA stream of their own, so that they overlap the
// consumer's compute. CUDA builds define make_copy_stream in copy_stream_cuda.cpp, CPU builds in
// copy_stream_none.cpp (CMake picks one), so that the loader never asks which build it is in.
#pragma once

#include <memory>
#include <vector>

#include <torch/torch.h>

namespace ptrain::data {

// The copies queued on a copy stream up to a point.
class CopyFence {
 public:
  virtual ~CopyFence() = default;
  // Orders the consumer's current stream after the copies, and tells the caching allocator that tensors
  // (allocated on the copy stream) are used there: otherwise it could hand their memory to the next copy
  // while the consumer's kernels still read it.
  virtual void hand_over(const std::vector<torch::Tensor>& tensors) = 0;
};

class CopyStream {
 public:
  virtual ~CopyStream() = default;
  // The stream's device, with its index.
  virtual torch::Device device() const = 0;
  // While the returned object lives, the stream is current on the calling thread (and its device current),
  // so that copies and allocations happen there.
  virtual std::shared_ptr<void> make_current() = 0;
  // A fence after everything queued on the stream so far.
  virtual std::unique_ptr<CopyFence> fence() = 0;
};

// A stream from the pool of the CUDA device (without an index: the current device). CPU builds: throws
// ptrain::Error naming the device.
std::unique_ptr<CopyStream> make_copy_stream(const torch::Device& device);

}  // namespace ptrain::data
