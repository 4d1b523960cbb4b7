// The training loop: epochs of optimizer steps over the plan's data, evaluation, checkpoints and the
// run's metrics record. The per-step work reads nothing back to the host; only progress updates
// (every --log-every steps) and epoch ends synchronise.
#pragma once

#include <functional>
#include <string>
#include <utility>

#include "ptrain/core/error.h"
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
// The allocator's peaks of one optimizer step, counted as the record's peak_allocated_bytes is.
struct StepMemory {
  int64_t global_step = 0;
  int64_t forward_backward_bytes = 0;  // over the micro-batches' forward and backward passes
  int64_t update_bytes = 0;            // over the update: gradient sync, unscale, clip, step, zero_grad
};
struct TrainHooks {
  // Called on every rank after each optimizer step; reading the loss synchronises the device.
  std::function<void(const StepReport&)> on_step;
  // Asked between steps: a signal number (SIGTERM, SIGINT) stops the run at that step boundary, which
  // saves a checkpoint of it (with --checkpoint-dir) and throws RunStopped; 0 trains on. Must be cheap.
  // Ranks agree on it through a collective, so it is set on every rank of a job or on none.
  std::function<int()> stop_signal;
  // Called after each optimizer step with its memory phase by phase (ptrain estimate's probes). Setting it
  // runs every step eagerly (a captured step cannot be read between its phases) and resets the allocator's
  // peak twice a step; the record's peaks still cover the whole run.
  std::function<void(const StepMemory&)> on_step_memory;
};

// A run that stopped early on a stop signal, or failed after it had trained (its evaluation, say):
// what() says which files hold the trained state, and record() is the run's metrics record, its
// extra.run_end saying how the run ended, for the caller to write as it writes a finished run's.
class RunStopped : public Error {
 public:
  RunStopped(const std::string& what, metrics::RunRecord record, int exit_code)
      : Error(what), record_(std::move(record)), exit_code_(exit_code) {}
  const metrics::RunRecord& record() const { return record_; }
  // 128 + the signal for a stopped run, as a shell reports a process a signal ended; for a failure the
  // code of the error itself (2, or 3 for LibTorch's own).
  int exit_code() const { return exit_code_; }
  bool interrupted() const { return exit_code_ > 128; }

 private:
  metrics::RunRecord record_;
  int exit_code_;
};

metrics::RunRecord train(const Plan& plan, const std::string& command_line, const TrainHooks& hooks = {});

// The model the run's data asks for: an image model's classes and input shape, or a language model's
// vocabulary and longest sequence. Refuses a model that does not match its data, naming the flags.
models::ModelSpec model_spec(const Plan& plan, const data::Dataset& train, const data::Dataset& test);

// The run's two splits as train opens them (--train-limit and --test-limit applied), refused where train refuses
// them: an empty split, classes that differ between them, --normalize values for another channel count, a loader
// batch (--batch-size x replicas, the devices of one process) larger than the training split.
struct Splits {
  data::Dataset train, test;
};
Splits open_splits(const Plan& plan, int64_t replicas);

// Everything train refuses before it builds the model on its device, checked without training (--dry-run): the
// splits (open_splits) and the model against them (model_spec; a TorchScript model loaded and run on the host, as
// the run loads it, so that logits of the wrong width are refused). The steps the run trains on them are
// estimate::run_length's to check. Returns the splits.
Splits check_before_training(const Plan& plan, int64_t replicas);

}  // namespace ptrain::train
