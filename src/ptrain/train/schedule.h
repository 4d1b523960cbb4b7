// Learning rate as a pure function of the optimizer step, so a resumed run needs nothing but the step.
#pragma once

#include <cstdint>

#include "ptrain/config/train_config.h"

namespace ptrain::train {

class LrSchedule {
 public:
  // steps_per_epoch: optimizer steps in one epoch; total_steps: in the whole run.
  LrSchedule(const config::OptimizerConfig& config, int64_t steps_per_epoch, int64_t total_steps);

  // The rate for optimizer step `step` (0-based): linear warm-up from 0 to lr, then constant, step
  // decay at epoch milestones, or a half cosine from lr to min_lr over the steps after warm-up.
  double lr(int64_t step) const;

 private:
  config::OptimizerConfig config_;
  int64_t steps_per_epoch_;
  int64_t total_steps_;
  int64_t warmup_steps_;
};

}  // namespace ptrain::train
