// How fast a run trains: every training second and image (RunRecord's train_wall_seconds and
// images_per_second), and the steady rate once the first steps are over (cuDNN's autotuning, the
// allocator's growth, a CUDA graph's capture: RunRecord::steady_images_per_second). Evaluation and the
// checkpoint at an epoch's end run outside both clocks; a checkpoint within an epoch (--checkpoint-every) runs
// inside them, so that a run's throughput is what it delivered with its checkpoints.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

namespace ptrain::train {

class ThroughputClock {
 public:
  using Clock = std::chrono::steady_clock;

  // The run trains steps first_step + 1 .. last_step (first_step: where it resumed). Warm-up left out of the
  // steady rate: 10 steps, or a quarter of a run shorter than 40; a run of fewer than 8 steps has no steady rate.
  void plan_steady(int64_t first_step, int64_t last_step);
  // Whether the steady clock starts once `step` is done; the caller waits for the device, then start_steady().
  bool steady_starts_after(int64_t step) const { return step == steady_from_step_; }
  void start_steady() { steady_start_ = last_mark_ = Clock::now(); }
  // The host has seen the device finish step `step` (a synchronisation the run makes anyway, or any step on
  // the CPU): the steady steps since the last mark become one entry of steady_step_seconds, their mean. No
  // wait of its own, so that timing the steps one by one never slows a CUDA run.
  void mark(int64_t step);
  // An epoch starts after step `step`, the device idle: what ran since the last mark (an evaluation, a
  // checkpoint) is no step's time.
  void begin_epoch(int64_t step);
  // One epoch's training: begun at `epoch_start`, `seconds` long with the device's work, steps step_before + 1
  // .. step_after, `images` in all. Its steady part ends now.
  void add_epoch(Clock::time_point epoch_start, double seconds, int64_t step_before, int64_t step_after, int64_t images);

  double train_seconds() const { return train_seconds_; }
  int64_t images() const { return images_; }
  // The step after which the steady clock started (-1: it never does), and its steps and seconds.
  int64_t steady_from_step() const { return steady_from_step_; }
  int64_t steady_steps() const { return steady_steps_; }
  double steady_seconds() const { return steady_seconds_; }
  // Seconds a steady step, one entry per mark; together they cover steady_seconds() (evaluation excluded).
  const std::vector<double>& steady_step_seconds() const { return step_seconds_; }

 private:
  int64_t steady_from_step_ = -1;
  std::optional<Clock::time_point> steady_start_;
  // Where the current stretch of steps began: the last mark, or the epoch's start after an evaluation.
  std::optional<Clock::time_point> last_mark_;
  int64_t last_mark_step_ = 0;
  std::vector<double> step_seconds_;
  double steady_seconds_ = 0;
  int64_t steady_steps_ = 0;
  double train_seconds_ = 0;
  int64_t images_ = 0;
};

}  // namespace ptrain::train
