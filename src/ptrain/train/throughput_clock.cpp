#include "ptrain/train/throughput_clock.h"

#include <algorithm>

namespace ptrain::train {

void ThroughputClock::plan_steady(int64_t first_step, int64_t last_step) {
  const int64_t steps = last_step - first_step;
  if (steps >= 8) steady_from_step_ = first_step + std::min<int64_t>(10, steps / 4);
}

void ThroughputClock::mark(int64_t step) {
  if (!last_mark_ || step <= steady_from_step_) return;
  const int64_t from = std::max(last_mark_step_, steady_from_step_);
  // A second mark at the same step (a progress read after a CPU step) leaves its time to the next stretch.
  if (step <= from) return;
  const auto now = Clock::now();
  step_seconds_.push_back(std::chrono::duration<double>(now - *last_mark_).count() / static_cast<double>(step - from));
  last_mark_ = now;
  last_mark_step_ = step;
}

void ThroughputClock::begin_epoch(int64_t step) {
  if (!last_mark_) return;
  last_mark_ = Clock::now();
  last_mark_step_ = step;
}

void ThroughputClock::add_epoch(Clock::time_point epoch_start, double seconds, int64_t step_before, int64_t step_after,
                                int64_t images) {
  if (steady_start_ && step_after > steady_from_step_) {
    steady_seconds_ += std::chrono::duration<double>(Clock::now() - std::max(*steady_start_, epoch_start)).count();
    steady_steps_ += step_after - std::max(step_before, steady_from_step_);
    mark(step_after);  // the epoch's last stretch ends here, after its synchronisation
  }
  train_seconds_ += seconds;
  images_ += images;
}

}  // namespace ptrain::train
