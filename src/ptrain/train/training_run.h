// One training run, as train() (trainer.h) drives it. Its parts live by what they do:
//   trainer.cpp                  the run's phases in order (the step engine built from the Plan's sections
//                                among them), the epoch loop, and train() with its advice when a device runs
//                                out of memory
//   training_data.cpp            the splits opened for the run's data, and what running out of host memory
//                                while loading them means
//   training_checkpoints.cpp     the named states checkpoints hold and resume gives back (the step engine's),
//                                and how a run that stops early or fails after training ends
//   training_outputs.cpp         the run's scalars for --tensorboard and --log-jsonl as progress is read, and
//                                the facts the run's record is filled with once training ends
// and the parts it owns, each with its own state, under run/ (built from the Plan's sections, plan_sections.h,
// never the config): stop_rules.h (whether and why the run ends early), run_data.h (the splits, their loaders and
// the steps they make), step_engine.h (the model, its optimizer and schedule, the loss scaler, the step runner
// that captures the step as a CUDA graph, the running totals, the divergence watch), run_checkpoints.h (resume,
// the saves and their writes in flight, --save-weights, what was kept), run_monitor.h (the clocks, FLOPs,
// step phases, GPU sampler, --profile-out's trace (profiler_window.h), the scalar logs and the library's step
// hooks) and run_recorder.h (the metrics record: facts in, the record out). The run itself holds the Plan,
// the strategy, these parts and its position; its phases hand each part the resolved values it needs.
// Internal to train/: the library's callers use trainer.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "ptrain/data/dataset.h"
#include "ptrain/io/named_tensors.h"
#include "ptrain/metrics/run_record.h"
#include "ptrain/metrics/timer.h"
#include "ptrain/models/zoo.h"
#include "ptrain/precision/policy.h"
#include "ptrain/strategies/strategy.h"
#include "ptrain/train/checkpoint.h"
#include "ptrain/train/optimizer.h"
#include "ptrain/train/plan.h"
#include "ptrain/train/progress.h"
#include "ptrain/train/run/run_checkpoints.h"
#include "ptrain/train/run/run_data.h"
#include "ptrain/train/run/run_monitor.h"
#include "ptrain/train/run/run_recorder.h"
#include "ptrain/train/run/step_engine.h"
#include "ptrain/train/run/stop_rules.h"
#include "ptrain/train/schedule.h"
#include "ptrain/train/trainer.h"

namespace ptrain::train {

// CUDA's caching allocator says "out of memory", the CPU allocator "can't allocate memory".
bool is_out_of_memory(const std::string& what);

class TrainingRun : private CheckpointedState {
 public:
  TrainingRun(const Plan& plan, const std::string& command_line, const TrainHooks& hooks);

  metrics::RunRecord run();

 private:
  // The phases of run(), in order.
  // Threads, math mode and allocator counters of the device, before anything is allocated.
  void set_up_device();
  // load_data, with out of memory there explained as the dataset's (not the model states').
  void load_data_or_explain();
  // The model as the run trains it, then what the optimizer updates, the optimizer and its schedule: the
  // step engine's parts. The seed is set first, so that a model is initialised the same in every run.
  void build_step_engine();
  std::shared_ptr<models::Model> build_model(const models::ModelSpec& spec);
  // Resumes --resume's checkpoint, if any, and checks that --stop-at-step comes after it and before the end.
  void resume();
  // What the run will do, printed before the first step: the plan, CUDA graphs, the data.
  void announce(Progress& progress);
  // --tensorboard and --log-jsonl opened by rank 0, after resume() knows the step the run continues from.
  void open_scalar_log();
  // Every epoch from the one resumed at; returns the last evaluation, if any ran. Each epoch's checkpoint,
  // and after the last one --save-weights, are written before its evaluation.
  std::optional<Evaluation> train_epochs(Progress& progress);
  // The record's facts, from the parts that hold them, once training has ended (or the run stops).
  void fill_record(const std::optional<Evaluation>& last_eval);
  // The scalars of a progress read (the window's mean loss and rates, and the step's own), to monitor_'s log.
  void log_progress(double mean_loss, double samples_per_second, double predictions_per_second);
  // Optimizer steps done, in epochs: fractional inside an epoch.
  double epochs_done() const;
  // extra.run_end of the record: how the run ended ("completed", "paused", "interrupted", "failed",
  // "diverged") and where its trained state is.
  nlohmann::json run_end(const std::string& status, const std::string& error) const;
  // Ends a run a stop signal stopped at this step boundary: its checkpoint, its record, RunStopped.
  [[noreturn]] void stop_at_signal(const TrainingPosition& position);
  // RunStopped for an error once the run had trained, naming what it kept.
  [[noreturn]] void fail_keeping_trained_state(const std::exception& error);
  // RunStopped for a run that diverged under --on-divergence stop: its record, marked "diverged", is
  // still written; nothing of the diverged state is.
  [[noreturn]] void stop_diverged(const std::exception& error);

  // Parts of the phases.
  void load_data();
  // The steps of one epoch, timed, with its training loss and accuracy over the ranks. steps_done: the
  // steps of the epoch done when it stopped (steps_per_epoch, or fewer at --max-steps).
  metrics::EpochRecord timed_epoch(int64_t epoch, Progress& progress, int64_t& steps_done);
  // Returns the steps of the epoch done when it stopped (steps_per_epoch, or fewer at --max-steps).
  int64_t train_epoch(int64_t epoch, int64_t first_micro_batch, Progress& progress);
  // The micro-batches of one optimizer step.
  struct StepBatches {
    std::vector<torch::Tensor> images, labels;
    int64_t micro_batches() const { return static_cast<int64_t>(images.size()); }
  };
  // The steps since the last progress read: what its rates count, and since when.
  struct ProgressWindow {
    metrics::Stopwatch clock;
    int64_t images = 0, predictions = 0;
  };
  // The parts of one step of train_epoch, in order: its batches read from the loader, the step run at the
  // schedule's rate, what follows each step (the library's on_step hook, the throughput clock), the
  // --checkpoint-every save, and at a progress read the window's loss and rates shown, logged and checked.
  void load_step_batches(int64_t step_in_epoch, StepBatches& batches, ProgressWindow& window);
  void run_step(const StepBatches& batches);
  void after_step(int64_t epoch, const StepBatches& batches);
  void save_on_cadence(int64_t epoch, int64_t step_in_epoch);
  void read_progress(int64_t step_in_epoch, ProgressWindow& window, Progress& progress);
  // Reads the divergence watch and hands what it found to stop_rules_. Every rank calls it together.
  void check_divergence() override;
  // The named states checkpoints_ writes and resumes (run/run_checkpoints.h), as engine_ gives them.
  io::NamedTensors model_state() override;
  io::NamedTensors full_parameters() override;
  io::NamedTensors full_optimizer_state() override;
  io::NamedTensors optimizer_state() override;
  io::NamedTensors local_shards(nlohmann::json* layout) override;
  io::NamedTensors scaler_state() override;
  io::NamedTensors progress_totals() override;
  void sync_buffers() override;
  bool finite() override;
  void load(const Checkpoint& checkpoint, const std::string& source) override;
  // Which flag set the run's last step: "--max-steps 40", or "--epochs 2 of 8 steps at --train-limit 64".
  std::string run_length_source() const;
  // The Plan's device and precision policy, which the phases read throughout.
  const torch::Device& device() const { return plan_.device; }
  const precision::PrecisionPolicy& policy() const { return plan_.precision; }
  // Devices sharing each step: processes x the replicas each drives. --batch-size counts per device.
  int64_t devices() const { return strategy_->world_size() * strategy_->replicas(); }
  // The devices of this process: the plan's device and, under dp, the ones after it.
  std::vector<torch::Device> local_devices() const;

  const Plan& plan_;
  std::unique_ptr<strategies::Strategy> strategy_;
  // Stop signals, --stop-at-step (a paused run saves where it is and ends, its schedule untouched, so that a
  // resume continues bit for bit) and --on-divergence: whether the run ends early, and how.
  StopRules stop_rules_;
  // --checkpoint-dir and --save-weights: resume, the saves and their writes in flight, what was kept.
  RunCheckpoints checkpoints_;
  // What the run measures and shows: its clocks, FLOPs, step phases, GPU sampler, trace and scalar logs.
  RunMonitor monitor_;
  // The run's metrics record: what the run learns as it goes, then the facts of its end.
  RunRecorder recorder_;

  std::unique_ptr<RunData> data_;  // made by load_data()
  // The model and its optimizer steps: made by build_step_engine(), once the data sets the model's shape.
  std::unique_ptr<StepEngine> engine_;
  // Where the run is.
  struct Position {
    int64_t global_step = 0;  // optimizer steps done, this run's and those of the checkpoint it resumed
    TrainingPosition start;   // where this run started: a resumed checkpoint's epoch and micro-batch
    bool evaluating = false;  // in an evaluation, after the epoch's checkpoint: the trained state is whole
    bool trained = false;     // the last step is done and its checkpoint and --save-weights are written
  } position_;
};

}  // namespace ptrain::train
