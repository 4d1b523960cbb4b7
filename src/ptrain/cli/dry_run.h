// `ptrain train --dry-run`: the plan, and what the strategy would make of the model without training:
// its units (FSDP units, ZeRO-3 units, the buckets of ddp and ZeRO-1/2) with their parameter counts and
// per-rank shards, and the model-state memory per rank the ZeRO arithmetic predicts.
#pragma once

#include <string>

#include "ptrain/train/plan.h"

namespace ptrain::cli {

std::string describe_layout(const train::Plan& plan);

// What training checks of the plan before it builds the model on its device, with train's own checks
// (train::check_before_training: the splits, the model against its data) and the steps it would train
// (estimate::run_length: an epoch without a step, a warm-up longer than the run, a step count that
// overflows): --dry-run refuses what train would.
void check_plan_on_data(const train::Plan& plan);

}  // namespace ptrain::cli
