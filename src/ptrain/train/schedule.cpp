#include "ptrain/train/schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "ptrain/core/error.h"

namespace ptrain::train {

RunSteps run_steps(const RunLength& length, int64_t micro_batches_per_epoch) {
  const int64_t accum = length.grad_accum;
  check(micro_batches_per_epoch >= accum, "--grad-accum " + std::to_string(accum) + " x --batch-size " +
                                              std::to_string(length.batch_size) + " is more than one epoch of data");
  RunSteps steps;
  steps.steps_per_epoch = (micro_batches_per_epoch + accum - 1) / accum;
  if (length.max_steps > 0) {
    steps.total_steps = length.max_steps;
    steps.epochs = (length.max_steps + steps.steps_per_epoch - 1) / steps.steps_per_epoch;
    return steps;
  }
  check(length.epochs <= std::numeric_limits<int64_t>::max() / steps.steps_per_epoch,
        "--epochs " + std::to_string(length.epochs) + " x " + std::to_string(steps.steps_per_epoch) +
            " steps an epoch overflows the step count");
  steps.epochs = length.epochs;
  steps.total_steps = steps.steps_per_epoch * length.epochs;
  return steps;
}

RunSteps run_steps(const config::TrainConfig& c, int64_t micro_batches_per_epoch) {
  return run_steps(RunLength{c.run.epochs, c.run.max_steps, c.optim.grad_accum, c.run.batch_size},
                   micro_batches_per_epoch);
}

LrSchedule::LrSchedule(const config::OptimizerConfig& config, int64_t steps_per_epoch, int64_t total_steps)
    : config_(config), steps_per_epoch_(steps_per_epoch), total_steps_(total_steps),
      warmup_steps_(config.warmup_steps > 0
                        ? config.warmup_steps
                        : static_cast<int64_t>(std::llround(config.warmup_epochs * static_cast<double>(steps_per_epoch)))) {
  check(steps_per_epoch > 0, "schedule: an epoch has no optimizer step (is --batch-size larger than the data?)");
  check(warmup_steps_ <= total_steps_, "--warmup-epochs (or --warmup-steps) is longer than the whole run");
  check(config.min_lr <= config.lr, "--min-lr must not exceed --lr");
  check(config.warmup_min_lr <= config.lr, "--warmup-min-lr must not exceed --lr");
  check(config.warmup_type == "linear" || config.warmup_type == "log",
        "--warmup-type: unknown warm-up '" + config.warmup_type + "' (known: linear, log)");
  check(std::is_sorted(config.milestones.begin(), config.milestones.end()), "--milestones must be increasing");
}

// DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR as deepspeed/runtime/lr_schedules.py computes them
// (DeepSpeed's master at edaa722). Its engine steps the scheduler after each optimizer step that was not
// skipped, and the scheduler's constructor sets its rate at last_batch_iteration -1: optimizer step s trains with
// the rate of iteration s - 1, the very first with the warm-up's floor (WarmupCosineLR's: 0). A step DeepSpeed
// skips on an fp16 overflow does not advance its scheduler, while ptrain's rate is a function of the step count,
// skipped steps included: under a dynamic loss scale, ptrain runs ahead of DeepSpeed by the steps skipped so far.
double LrSchedule::deepspeed_lr(int64_t step) const {
  const int64_t iteration = step - 1;
  const bool cosine = config_.schedule == "WarmupCosineLR";
  const double max_lr = config_.lr, min_lr = config_.warmup_min_lr;
  if (iteration < 0) return cosine ? 0.0 : min_lr;
  // DeepSpeed warms up over at least 2 iterations (log(1) would divide by zero).
  const int64_t warmup = std::max<int64_t>(2, warmup_steps_);
  if (iteration < warmup) {
    const double gamma = config_.warmup_type == "log"
                             ? 1.0 / std::log(static_cast<double>(warmup)) * std::log(static_cast<double>(iteration + 1))
                             : static_cast<double>(iteration) / static_cast<double>(warmup);
    // WarmupCosineLR's warmup_min_ratio is the floor over lr (config::deepspeed reads it into warmup_min_lr).
    return min_lr + (max_lr - min_lr) * gamma;
  }
  if (config_.schedule == "WarmupLR") return max_lr;
  const int64_t total = total_steps_;
  if (config_.schedule == "WarmupDecayLR") {
    const double gamma = std::max(0.0, static_cast<double>(total - iteration) /
                                           std::max(1.0, static_cast<double>(total - warmup)));
    return min_lr + (max_lr - min_lr) * gamma;
  }
  // WarmupCosineLR, whose floor cos_min_ratio is min_lr over lr; progress clamped at 1, as DeepSpeed does since it
  // stopped letting the cosine rise again past total_num_steps.
  const double progress = std::min(1.0, static_cast<double>(iteration - warmup + 1) /
                                            static_cast<double>(std::max<int64_t>(1, total - warmup)));
  return std::max(0.0, config_.min_lr + (max_lr - config_.min_lr) * (1.0 + std::cos(M_PI * progress)) / 2.0);
}

double LrSchedule::lr(int64_t step) const {
  if (config_.schedule == "WarmupLR" || config_.schedule == "WarmupDecayLR" || config_.schedule == "WarmupCosineLR")
    return deepspeed_lr(step);
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
  throw Error("--schedule: unknown schedule '" + config_.schedule + "' (known: constant, step, cosine, WarmupLR, WarmupDecayLR, WarmupCosineLR)");
}

}  // namespace ptrain::train
