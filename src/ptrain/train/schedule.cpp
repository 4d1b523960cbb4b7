#include "ptrain/train/schedule.h"

#include <algorithm>
#include <cmath>

#include "ptrain/core/error.h"

namespace ptrain::train {

LrSchedule::LrSchedule(const config::OptimizerConfig& config, int64_t steps_per_epoch, int64_t total_steps)
    : config_(config), steps_per_epoch_(steps_per_epoch), total_steps_(total_steps),
      warmup_steps_(config.warmup_steps > 0
                        ? config.warmup_steps
                        : static_cast<int64_t>(std::llround(config.warmup_epochs * static_cast<double>(steps_per_epoch)))) {
  check(steps_per_epoch > 0, "schedule: an epoch has no optimizer step (is --batch-size larger than the data?)");
  check(warmup_steps_ <= total_steps_, "--warmup-epochs (or --warmup-steps) is longer than the whole run");
  check(config.min_lr <= config.lr, "--min-lr must not exceed --lr");
  check(std::is_sorted(config.milestones.begin(), config.milestones.end()), "--milestones must be increasing");
}

double LrSchedule::lr(int64_t step) const {
  if (step < warmup_steps_) return config_.lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
  if (config_.schedule == "constant") return config_.lr;
  if (config_.schedule == "step") {
    const int64_t epoch = step / steps_per_epoch_;
    const auto passed = std::upper_bound(config_.milestones.begin(), config_.milestones.end(), epoch) -
                        config_.milestones.begin();
    return config_.lr * std::pow(config_.gamma, static_cast<double>(passed));
  }
  if (config_.schedule == "cosine") {
    const int64_t span = std::max<int64_t>(1, total_steps_ - warmup_steps_);
    const double progress = std::min(1.0, static_cast<double>(step - warmup_steps_) / static_cast<double>(span));
    return config_.min_lr + 0.5 * (config_.lr - config_.min_lr) * (1.0 + std::cos(M_PI * progress));
  }
  throw Error("--schedule: unknown schedule '" + config_.schedule + "' (known: constant, step, cosine)");
}

}  // namespace ptrain::train
