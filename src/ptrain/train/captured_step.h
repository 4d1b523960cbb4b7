// Whole-step CUDA graphs: forward, backward, loss scaling and the optimizer step recorded once and replayed
// every step after, so that a step costs the GPU's time and not the host's thousand kernel launches.
// The trainer decides whether a run can be captured (train/trainer.cpp); this is the CUDA mechanism, chosen
// at link time: captured_step_cuda.cpp in CUDA builds, captured_step_none.cpp otherwise.
#pragma once

#include <functional>
#include <memory>

#include <torch/torch.h>

namespace ptrain::train {

class CapturedStep {
 public:
  virtual ~CapturedStep() = default;
  // Runs fn with a side stream current, ordered after the current stream's work and before its later work.
  // The eager steps before a capture run here: a capture cannot start on the stream that ran them first.
  virtual void run_on_capture_stream(const std::function<void()>& fn) = 0;
  // Records fn's kernels into the graph without running them (the next replay() runs them). Throws
  // ptrain::Error with CUDA's reason when the capture fails; the graph is then unusable.
  virtual void capture(const std::function<void()>& fn) = 0;
  // Runs the recorded step on the current stream.
  virtual void replay() = 0;
  // Once no step is left to replay: waits for the last replay, frees the graph and returns its private pool's
  // memory to the driver, so that what runs after training (the final evaluation) does not stack its memory on
  // the pool's. replay() is refused after.
  virtual void release() = 0;
};

// nullptr where there are no CUDA graphs: CPU builds, and CPU devices.
std::unique_ptr<CapturedStep> make_captured_step(const torch::Device& device);

// While it lives, the calling thread's device work on a CUDA device goes to a stream of the run's own instead
// of the legacy default stream, ordered after what the default stream was given before and before what it is
// given after. Autograd binds a parameter's gradient accumulator to the stream current when it is made, and the
// data-parallel strategies keep theirs (their gradient hooks live there) from prepare() on: made on the legacy
// stream, they would make every captured backward depend on it, which CUDA refuses. On the run's stream the
// hooks, the eager steps, the capture and its replays all share one stream. Nothing on CPU devices or builds.
class RunStream {
 public:
  virtual ~RunStream() = default;
};
std::unique_ptr<RunStream> use_run_stream(const torch::Device& device);

}  // namespace ptrain::train
