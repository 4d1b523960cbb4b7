#include "ptrain/train/step_runner.h"

#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"

namespace ptrain::train {

StepRunner::StepRunner(std::unique_ptr<CapturedStep> graph, metrics::StepPhaseTimer& phases, DeviceStep device_step)
    : graph_(std::move(graph)), phases_(phases), device_step_(std::move(device_step)) {}

void StepRunner::capture(const Batches& images, const Batches& labels) {
  // The graph reads its micro-batches from these tensors, filled before every replay.
  static_images_.clear();
  static_labels_.clear();
  for (size_t m = 0; m < images.size(); ++m) {
    static_images_.push_back(torch::empty_like(images[m]).copy_(images[m]));
    static_labels_.push_back(torch::empty_like(labels[m]).copy_(labels[m]));
  }
  // Autocast's cast cache would hold casts made inside the capture past its end.
  const bool cache = compat::autocast_cache_enabled();
  compat::set_autocast_cache_enabled(false);
  phases_.set_capturing(true);
  try {
    graph_->capture([&] { device_step_(static_images_, static_labels_); });
  } catch (...) {
    phases_.set_capturing(false);
    compat::set_autocast_cache_enabled(cache);
    throw;
  }
  phases_.set_capturing(false);
  compat::set_autocast_cache_enabled(cache);
  captured_ = true;
  graph_->replay();  // the capture recorded the step; this runs it
  ++replays_;
}

void StepRunner::run(const Batches& images, const Batches& labels) {
  check(!released_, "step runner: a step after release_graph()");
  if (captured_) {
    for (size_t m = 0; m < images.size(); ++m) {
      static_images_[m].copy_(images[m]);
      static_labels_[m].copy_(labels[m]);
    }
    graph_->replay();
    ++replays_;
    return;
  }
  if (graph_ && eager_steps_ >= kEagerStepsBeforeCapture) {
    capture(images, labels);
    return;
  }
  if (graph_) {
    graph_->run_on_capture_stream([&] { device_step_(images, labels); });
    ++eager_steps_;
  } else {
    device_step_(images, labels);
  }
  phases_.end_step();
}

void StepRunner::run_eagerly(const Batches& images, const Batches& labels) {
  check(!released_, "step runner: a step after release_graph()");
  if (graph_) {
    graph_->run_on_capture_stream([&] { device_step_(images, labels); });
  } else {
    device_step_(images, labels);
  }
  phases_.end_step();
}

void StepRunner::release_graph() {
  if (graph_) graph_->release();
  static_images_.clear();
  static_labels_.clear();
  released_ = true;
}

int64_t StepRunner::take_replays() {
  const int64_t replays = replays_;
  replays_ = 0;
  return replays;
}

}  // namespace ptrain::train
