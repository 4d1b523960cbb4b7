// The training loop: epochs of optimizer steps over the plan's data, evaluation, checkpoints and the
// run's metrics record. The per-step work reads nothing back to the host; only progress updates
// (every --log-every steps) and epoch ends synchronise.
#pragma once

#include <string>

#include "ptrain/metrics/run_record.h"
#include "ptrain/train/plan.h"

namespace ptrain::train {

metrics::RunRecord train(const Plan& plan, const std::string& command_line);

}  // namespace ptrain::train
