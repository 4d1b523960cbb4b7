// How fast a run trains: every training second and image (RunRecord's train_wall_seconds and
// images_per_second), and the steady rate once the first steps are over (cuDNN's autotuning, the
// allocator's growth, a CUDA graph's capture: RunRecord::steady_images_per_second). Evaluation and
// checkpoints run outside both clocks.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

namespace ptrain::train {

class ThroughputClock {
 public:
  using Clock = std::chrono::steady_clock;

  // The run trains steps first_step + 1 .. last_step (first_step: where it resumed). Warm-up left out of the
  // steady rate: 10 steps, or a quarter of a run shorter than 40; a run of fewer than 8 steps has no steady rate.
  void plan_steady(int64_t first_step, int64_t last_step);
  // Whether the steady clock starts once `step` is done; the caller waits for the device, then start_steady().
  bool steady_starts_after(int64_t step) const { return step == steady_from_step_; }
  void start_steady() { steady_start_ = Clock::now(); }
  // One epoch's training: begun at `epoch_start`, `seconds` long with the device's work, steps step_before + 1
  // .. step_after, `images` in all. Its steady part ends now.
  void add_epoch(Clock::time_point epoch_start, double seconds, int64_t step_before, int64_t step_after, int64_t images);

  double train_seconds() const { return train_seconds_; }
  int64_t images() const { return images_; }
  // The step after which the steady clock started (-1: it never does), and its steps and seconds.
  int64_t steady_from_step() const { return steady_from_step_; }
  int64_t steady_steps() const { return steady_steps_; }
  double steady_seconds() const { return steady_seconds_; }

 private:
  int64_t steady_from_step_ = -1;
  std::optional<Clock::time_point> steady_start_;
  double steady_seconds_ = 0;
  int64_t steady_steps_ = 0;
  double train_seconds_ = 0;
  int64_t images_ = 0;
};

}  // namespace ptrain::train
