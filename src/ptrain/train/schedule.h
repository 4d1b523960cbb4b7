// Learning rate as a pure function of the optimizer step, so a resumed run needs nothing but the step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ptrain::train {

// The optimizer steps of a run. An epoch's micro-batches go in windows of --grad-accum, the last one shorter
// where they do not divide (as accelerate steps at an epoch's end: every sample trains, each step's gradient
// the mean of its window's). --max-steps, as Hugging Face's max_steps, overrides --epochs: the run trains that
// many steps over as many epochs as they take. Throws ptrain::Error naming the flags where an epoch holds
// fewer micro-batches than one window, or the step count overflows.
struct RunSteps {
  int64_t steps_per_epoch = 0;
  int64_t epochs = 0;
  int64_t total_steps = 0;
};
// The flags that set a run's length, as run_steps reads them (batch_size only names the flag in its errors).
struct RunLength {
  int64_t epochs = 1, max_steps = 0, grad_accum = 1, batch_size = 1;
};
RunSteps run_steps(const RunLength& length, int64_t micro_batches_per_epoch);

// --schedule: ptrain's own (constant, step, cosine) or DeepSpeed's, step for step (WarmupLR, WarmupDecayLR,
// WarmupCosineLR).
enum class ScheduleKind { kConstant, kStep, kCosine, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };
// --warmup-type: how the DeepSpeed schedules rise over their warm-up.
enum class WarmupRise { kLinear, kLog };

// The kind a --schedule name (as the config holds it) names; throws ptrain::Error naming the flag and the known
// names for any other.
ScheduleKind schedule_kind(const std::string& name);
const char* schedule_name(ScheduleKind kind);
// The rise a --warmup-type name names; throws ptrain::Error naming the flag for any other.
WarmupRise warmup_rise(const std::string& name);

// The schedule's flags as train/plan.h's schedule_options resolves them: what the schedule is built from, so that
// the run (train/run/) needs no config to build it.
struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::kCosine;
  double lr = 0.1;
  std::vector<int64_t> milestones;  // step: epochs at which lr *= gamma
  double gamma = 0.1;
  double min_lr = 0.0;              // cosine's floor (WarmupCosineLR's too)
  double warmup_epochs = 0.0;       // linear warm-up from 0, in (fractional) epochs
  int64_t warmup_steps = 0;         // the same in optimizer steps, instead of warmup_epochs; 0: off
  WarmupRise warmup_rise = WarmupRise::kLinear;  // the Warmup* schedules' rise
  double warmup_min_lr = 0.0;       // the Warmup* schedules' first rate (WarmupDecayLR's last)
};

class LrSchedule {
 public:
  // steps_per_epoch: optimizer steps in one epoch; total_steps: in the whole run.
  LrSchedule(const ScheduleOptions& options, int64_t steps_per_epoch, int64_t total_steps);

  // The rate for optimizer step `step` (0-based): linear warm-up from 0 to lr, then constant, step
  // decay at epoch milestones, or a half cosine from lr to min_lr over the steps after warm-up. The
  // schedules named as DeepSpeed names them (WarmupLR, WarmupDecayLR, WarmupCosineLR) give the rate DeepSpeed's
  // scheduler of that name gives the same optimizer step (see deepspeed_lr).
  double lr(int64_t step) const;

 private:
  double deepspeed_lr(int64_t step) const;

  ScheduleOptions options_;
  int64_t steps_per_epoch_;
  int64_t total_steps_;
  int64_t warmup_steps_;
};

}  // namespace ptrain::train
