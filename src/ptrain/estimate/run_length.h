// How long a run trains on its data, counted before it starts as its trainer will count it: what
// `--dry-run`, `ptrain estimate` and the bench's plans check of a run, so that a batch larger than the data
// or a warm-up longer than the run is refused before any training.
#pragma once

#include <cstdint>

#include "ptrain/data/registry.h"
#include "ptrain/train/plan_sections.h"

namespace ptrain::estimate {

// The optimizer steps a run trains, as its trainer counts them.
struct RunLength {
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;   // every epoch's, or --max-steps (which overrides --epochs)
  int64_t warmup_steps = 0;  // --warmup-steps, or --warmup-epochs of an epoch's steps
};

// The steps of a run on train_samples training samples, spread over `processes` processes (each takes
// its share, as the distributed sampler deals it) and `replicas` devices per process (dp). Throws
// ptrain::Error naming the flags, with the trainer's and the schedule's own words, where the run cannot
// train: a batch larger than the data, an epoch without a step, a warm-up longer than the run. length and schedule:
// the plan's (train::Plan::length, its optimization's schedule), or train/plan.h's of a config without a plan.
RunLength run_length(const train::RunLength& length, const train::ScheduleOptions& schedule, int64_t train_samples,
                     int64_t processes, int64_t replicas);

// The training samples a run on data trains on (after options' --train-limit), counted as cheaply as its data
// allows (an image folder's listing, not its decoded images). Throws ptrain::Error when the data cannot be
// opened. With run_length, what `--dry-run` and `ptrain estimate` check of a run's data, as training will.
int64_t training_samples(const data::DataSpec& data, const train::DataOptions& options);

}  // namespace ptrain::estimate
