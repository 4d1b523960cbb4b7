// The training loop: epochs of optimizer steps over the plan's data, evaluation, checkpoints and the
// run's metrics record. The per-step work reads nothing back to the host; only progress updates
// (every --log-every steps) and epoch ends synchronise.
#pragma once

#include <string>

#include "ptrain/config/train_config.h"
#include "ptrain/data/dataset.h"
#include "ptrain/metrics/run_record.h"
#include "ptrain/models/zoo.h"
#include "ptrain/train/plan.h"

namespace ptrain::train {

metrics::RunRecord train(const Plan& plan, const std::string& command_line);

// The model the run's data asks for: an image model's classes and input shape, or a language model's
// vocabulary and longest sequence. Refuses a model that does not match its data, naming the flags.
models::ModelSpec model_spec(const config::TrainConfig& c, const data::Dataset& train, const data::Dataset& test);

}  // namespace ptrain::train
