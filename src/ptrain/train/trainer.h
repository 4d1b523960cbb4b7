// The training loop: epochs of optimizer steps over the plan's data, evaluation, checkpoints and the
// run's metrics record. The per-step work reads nothing back to the host; only progress updates
// (every --log-every steps) and epoch ends synchronise.
#pragma once

#include <functional>
#include <string>

#include "ptrain/config/train_config.h"
#include "ptrain/data/dataset.h"
#include "ptrain/metrics/run_record.h"
#include "ptrain/models/zoo.h"
#include "ptrain/train/plan.h"

namespace ptrain::train {

// What a caller of train() may follow as it runs (the library API's callbacks).
struct StepReport {
  int64_t epoch = 0;
  int64_t global_step = 0;  // optimizer steps taken, this one included
  double loss = 0;          // this rank's mean training loss over the step's micro-batches, before the update
};
struct TrainHooks {
  // Called on every rank after each optimizer step; reading the loss synchronises the device.
  std::function<void(const StepReport&)> on_step;
};

metrics::RunRecord train(const Plan& plan, const std::string& command_line, const TrainHooks& hooks = {});

// The model the run's data asks for: an image model's classes and input shape, or a language model's
// vocabulary and longest sequence. Refuses a model that does not match its data, naming the flags.
models::ModelSpec model_spec(const config::TrainConfig& c, const data::Dataset& train, const data::Dataset& test);

}  // namespace ptrain::train
