#include "ptrain/train/schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

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

namespace {

constexpr std::pair<ScheduleKind, const char*> kScheduleNames[] = {
    {ScheduleKind::kConstant, "constant"},           {ScheduleKind::kStep, "step"},
    {ScheduleKind::kCosine, "cosine"},               {ScheduleKind::kWarmupLR, "WarmupLR"},
    {ScheduleKind::kWarmupDecayLR, "WarmupDecayLR"}, {ScheduleKind::kWarmupCosineLR, "WarmupCosineLR"}};

bool is_deepspeed(ScheduleKind kind) {
  return kind == ScheduleKind::kWarmupLR || kind == ScheduleKind::kWarmupDecayLR || kind == ScheduleKind::kWarmupCosineLR;
}

}  // namespace

ScheduleKind schedule_kind(const std::string& name) {
  std::string known_names;
  for (const auto& [kind, known] : kScheduleNames) {
    if (name == known) return kind;
    known_names += (known_names.empty() ? "" : ", ") + std::string(known);
  }
  throw Error("--schedule: unknown schedule '" + name + "' (known: " + known_names + ")");
}

const char* schedule_name(ScheduleKind kind) {
  for (const auto& [known, name] : kScheduleNames) {
    if (kind == known) return name;
  }
  return "?";
}

WarmupRise warmup_rise(const std::string& name) {
  if (name == "linear") return WarmupRise::kLinear;
  if (name == "log") return WarmupRise::kLog;
  throw Error("--warmup-type: unknown warm-up '" + name + "' (known: linear, log)");
}

LrSchedule::LrSchedule(const ScheduleOptions& options, int64_t steps_per_epoch, int64_t total_steps)
    : options_(options), steps_per_epoch_(steps_per_epoch), total_steps_(total_steps),
      warmup_steps_(options.warmup_steps > 0
                        ? options.warmup_steps
                        : static_cast<int64_t>(std::llround(options.warmup_epochs * static_cast<double>(steps_per_epoch)))) {
  check(steps_per_epoch > 0, "schedule: an epoch has no optimizer step (is --batch-size larger than the data?)");
  check(warmup_steps_ <= total_steps_, "--warmup-epochs (or --warmup-steps) is longer than the whole run");
  check(options.min_lr <= options.lr, "--min-lr must not exceed --lr");
  check(options.warmup_min_lr <= options.lr, "--warmup-min-lr must not exceed --lr");
  check(std::is_sorted(options.milestones.begin(), options.milestones.end()), "--milestones must be increasing");
}

// DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR as deepspeed/runtime/lr_schedules.py computes them
// (DeepSpeed's master at edaa722). Its engine steps the scheduler after each optimizer step that was not
// skipped, and the scheduler's constructor sets its rate at last_batch_iteration -1: optimizer step s trains with
// the rate of iteration s - 1, the very first with the warm-up's floor (WarmupCosineLR's: 0). A step DeepSpeed
// skips on an fp16 overflow does not advance its scheduler, while ptrain's rate is a function of the step count,
// skipped steps included: under a dynamic loss scale, ptrain runs ahead of DeepSpeed by the steps skipped so far.
double LrSchedule::deepspeed_lr(int64_t step) const {
  const int64_t iteration = step - 1;
  const bool cosine = options_.kind == ScheduleKind::kWarmupCosineLR;
  const double max_lr = options_.lr, min_lr = options_.warmup_min_lr;
  if (iteration < 0) return cosine ? 0.0 : min_lr;
  // DeepSpeed warms up over at least 2 iterations (log(1) would divide by zero).
  const int64_t warmup = std::max<int64_t>(2, warmup_steps_);
  if (iteration < warmup) {
    const double gamma = options_.warmup_rise == WarmupRise::kLog
                             ? 1.0 / std::log(static_cast<double>(warmup)) * std::log(static_cast<double>(iteration + 1))
                             : static_cast<double>(iteration) / static_cast<double>(warmup);
    // WarmupCosineLR's warmup_min_ratio is the floor over lr (config::deepspeed reads it into warmup_min_lr).
    return min_lr + (max_lr - min_lr) * gamma;
  }
  if (options_.kind == ScheduleKind::kWarmupLR) return max_lr;
  const int64_t total = total_steps_;
  if (options_.kind == ScheduleKind::kWarmupDecayLR) {
    const double gamma = std::max(0.0, static_cast<double>(total - iteration) /
                                           std::max(1.0, static_cast<double>(total - warmup)));
    return min_lr + (max_lr - min_lr) * gamma;
  }
  // WarmupCosineLR, whose floor cos_min_ratio is min_lr over lr; progress clamped at 1, as DeepSpeed does since it
  // stopped letting the cosine rise again past total_num_steps.
  const double progress = std::min(1.0, static_cast<double>(iteration - warmup + 1) /
                                            static_cast<double>(std::max<int64_t>(1, total - warmup)));
  return std::max(0.0, options_.min_lr + (max_lr - options_.min_lr) * (1.0 + std::cos(M_PI * progress)) / 2.0);
}

double LrSchedule::lr(int64_t step) const {
  if (is_deepspeed(options_.kind)) return deepspeed_lr(step);
  if (step < warmup_steps_) return options_.lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
  switch (options_.kind) {
    case ScheduleKind::kConstant:
      return options_.lr;
    case ScheduleKind::kStep: {
      const int64_t epoch = step / steps_per_epoch_;
      const auto passed = std::upper_bound(options_.milestones.begin(), options_.milestones.end(), epoch) -
                          options_.milestones.begin();
      return options_.lr * std::pow(options_.gamma, static_cast<double>(passed));
    }
    case ScheduleKind::kCosine:
    default: {
      const int64_t span = std::max<int64_t>(1, total_steps_ - warmup_steps_);
      const double progress = std::min(1.0, static_cast<double>(step - warmup_steps_) / static_cast<double>(span));
      return options_.min_lr + 0.5 * (options_.lr - options_.min_lr) * (1.0 + std::cos(M_PI * progress));
    }
  }
}

}  // namespace ptrain::train
