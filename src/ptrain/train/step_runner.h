// How an optimizer step runs on the device: eagerly, or with CUDA graphs, eagerly on the capture stream
// for the first steps (cuDNN's autotuning and the allocator's pools settle there), then captured once and
// replayed, every replay fed through the static input tensors the graph reads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "ptrain/metrics/step_phases.h"
#include "ptrain/train/captured_step.h"

namespace ptrain::train {

class StepRunner {
 public:
  using Batches = std::vector<torch::Tensor>;
  // What a step does on the device, host-free where the strategy is: what a CUDA graph captures.
  using DeviceStep = std::function<void(const Batches& images, const Batches& labels)>;

  static constexpr int64_t kEagerStepsBeforeCapture = 3;

  // graph: nullptr runs every step eagerly. The step phases' timer learns of captures and replays.
  StepRunner(std::unique_ptr<CapturedStep> graph, metrics::StepPhaseTimer& phases, DeviceStep device_step);

  // One step on micro-batches already on the device: eagerly, or by capturing or replaying it.
  void run(const Batches& images, const Batches& labels);
  // One step run eagerly whatever the graph: an epoch's shorter last window of micro-batches, which the captured
  // step (of a full window) cannot replay. It does not count toward the eager steps before the capture.
  void run_eagerly(const Batches& images, const Batches& labels);
  // The steps replayed since the last call (the phase timer cannot see inside a replay).
  int64_t take_replays();
  // Whether the steps are (or, after release_graph(), were) replayed from a captured graph.
  bool captured() const { return captured_; }
  // After the last step: the captured graph and its memory go (CapturedStep::release); run() is refused after.
  void release_graph();

 private:
  void capture(const Batches& images, const Batches& labels);

  std::unique_ptr<CapturedStep> graph_;
  metrics::StepPhaseTimer& phases_;
  DeviceStep device_step_;
  bool captured_ = false;
  bool released_ = false;
  int64_t eager_steps_ = 0;
  int64_t replays_ = 0;
  Batches static_images_, static_labels_;
};

}  // namespace ptrain::train
