// One training run, as train() (trainer.h) drives it. Its parts live by what they do:
//   trainer.cpp                  the run's phases in order, the epoch loop, evaluation, and train() with
//                                its advice when a device runs out of memory
//   training_step.cpp            one optimizer step: micro-batches, the update, whether it can be captured
//   training_data.cpp            the datasets and loaders, and what running out of host memory there means
//   training_checkpoints.cpp     resume, checkpoints, --save-weights and the finiteness check they need,
//                                and what a run that stops early or fails after training keeps
//   training_record.cpp          the run's metrics record, assembled once training ends
//   training_log.cpp             the scalars of --tensorboard and --log-jsonl, as progress is read
// and the parts it owns, each with its own state: step_runner.h (eager steps, then a captured CUDA graph and
// its static inputs), throughput_clock.h (training seconds, images, the steady rate), and under run/ (built
// from the Plan's resolved values, never the config) stop_rules.h (whether and why the run ends early) and
// profiler_window.h (--profile-out's trace).
// Internal to train/: the library's callers use trainer.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "ptrain/config/train_config.h"
#include "ptrain/core/profiler_range.h"
#include "ptrain/data/dataset.h"
#include "ptrain/data/loader.h"
#include "ptrain/io/named_tensors.h"
#include "ptrain/metrics/gpu_sampler.h"
#include "ptrain/metrics/memory.h"
#include "ptrain/metrics/run_record.h"
#include "ptrain/train/run_flops.h"
#include "ptrain/metrics/scalar_log.h"
#include "ptrain/metrics/step_phases.h"
#include "ptrain/metrics/timer.h"
#include "ptrain/models/zoo.h"
#include "ptrain/precision/loss_scaler.h"
#include "ptrain/precision/policy.h"
#include "ptrain/strategies/strategy.h"
#include "ptrain/train/step_runner.h"
#include "ptrain/train/checkpoint.h"
#include "ptrain/train/checkpointer.h"
#include "ptrain/train/divergence.h"
#include "ptrain/train/optimizer.h"
#include "ptrain/train/plan.h"
#include "ptrain/train/progress.h"
#include "ptrain/train/run/profiler_window.h"
#include "ptrain/train/run/stop_rules.h"
#include "ptrain/train/schedule.h"
#include "ptrain/train/throughput_clock.h"
#include "ptrain/train/trainer.h"

namespace ptrain::train {

// Sums kept on the device during an epoch; read back only when progress is shown. A captured step adds
// into these very tensors at every replay, so they are reset in place, never replaced.
struct RunningTotals {
  torch::Tensor loss_sum, correct, samples;
  torch::Tensor window_loss;  // the loss sum since the last progress line

  explicit RunningTotals(const torch::Device& device) {
    auto options = torch::TensorOptions().dtype(torch::kDouble).device(device);
    loss_sum = torch::zeros({}, options);
    correct = torch::zeros({}, options);
    samples = torch::zeros({}, options);
    window_loss = torch::zeros({}, options);
  }
  void reset() {
    loss_sum.zero_();
    correct.zero_();
    samples.zero_();
    window_loss.zero_();
  }
  io::NamedTensors named() const { return {{"loss_sum", loss_sum}, {"correct", correct}, {"samples", samples}}; }
  void load(const io::NamedTensors& saved) {
    for (const auto& [name, value] : saved) {
      if (name == "loss_sum") loss_sum.copy_(value);
      if (name == "correct") correct.copy_(value);
      if (name == "samples") samples.copy_(value);
    }
  }
};

struct Evaluation {
  double loss = 0, accuracy = 0;
};

// CUDA's caching allocator says "out of memory", the CPU allocator "can't allocate memory".
bool is_out_of_memory(const std::string& what);

// Image models give logits [B, classes] for labels [B]; language models [B, T, vocab] for labels [B, T], every
// position a prediction of its next token. Both flatten to [predictions, classes] and [predictions].
inline torch::Tensor prediction_logits(const torch::Tensor& logits) {
  return logits.dim() > 2 ? logits.flatten(0, -2) : logits;
}
inline torch::Tensor prediction_labels(const torch::Tensor& labels) {
  return labels.dim() > 1 ? labels.flatten() : labels;
}

class TrainingRun {
 public:
  TrainingRun(const Plan& plan, const std::string& command_line, const TrainHooks& hooks);

  metrics::RunRecord run();

 private:
  // The phases of run(), in order.
  // --checkpoint-dir taken for the run (train/checkpointer.h): first, so that a directory another run
  // holds is refused before any work.
  void open_checkpoint_dir();
  // Threads, math mode and allocator counters of the device, before anything is allocated.
  void set_up_device();
  // load_data, with out of memory there explained as the dataset's (not the model states').
  void load_data_or_explain();
  void build_model();
  void build_optimizer();
  // Resumes --resume's checkpoint, if any, and checks that --stop-at-step comes after it and before the end.
  void resume();
  // What the run will do, printed before the first step: the plan, CUDA graphs, the data.
  void announce(Progress& progress);
  // --async-checkpoint on a GPU: the host memory its saves copy the state into, pinned in the background
  // while the run warms up rather than by the first save's write (checkpoint_staging.h).
  void reserve_checkpoint_staging();
  // --tensorboard and --log-jsonl opened by rank 0, after resume() knows the step the run continues from.
  void open_scalar_log();
  void start_gpu_sampler();
  // Every epoch from the one resumed at; returns the last evaluation, if any ran. Each epoch's checkpoint,
  // and after the last one --save-weights, are written before its evaluation.
  std::optional<Evaluation> train_epochs(Progress& progress);
  void export_weights();
  void fill_record(const metrics::Stopwatch& run_clock, const std::optional<Evaluation>& last_eval);
  // The scalars of a progress read (the window's mean loss and rates) and of an epoch's end, to scalar_log_.
  void log_progress(double mean_loss, double samples_per_second, double predictions_per_second);
  void log_epoch(const metrics::EpochRecord& epoch_record);
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
  // Why nothing was kept: "no --checkpoint-dir or --save-weights", or what the flags given did not write.
  std::string why_nothing_was_kept() const;
  // "weights in w.pt and checkpoint ck/step-00000008.safetensors (step 8)", or "" when nothing was written.
  std::string what_was_kept() const;
  void record_what_ran_and_how_fast(const metrics::Stopwatch& run_clock);
  void record_memory_and_utilisation();
  void record_implementation();

  // Parts of the phases.
  void load_data();
  // The steps of one epoch, timed, with its training loss and accuracy over the ranks. steps_done: the
  // steps of the epoch done when it stopped (steps_per_epoch_, or fewer at --max-steps).
  metrics::EpochRecord timed_epoch(int64_t epoch, Progress& progress, int64_t& steps_done);
  // Returns the steps of the epoch done when it stopped (steps_per_epoch_, or fewer at --max-steps).
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
  // A token dataset's tokens a sample (what throughput counts as tokens/s), 0 for images.
  int64_t sequence_length() const;
  // The micro-batches of an epoch that its first `steps` optimizer steps read (the last window may be short).
  int64_t micro_batches_of(int64_t steps) const;
  // What a step does on the device, host-free where the strategy is: what steps_ runs, or captures.
  void device_step(const std::vector<torch::Tensor>& images, const std::vector<torch::Tensor>& labels);
  torch::Tensor optimizer_step();
  // Why this run's steps cannot be captured as a CUDA graph, or "" when they can.
  std::string capture_obstacle() const;
  // Takes the step phases measured since the last call into the totals; where the host has waited anyway.
  void collect_step_phases();
  Evaluation evaluate();
  // A checkpoint of this position (rank agreement and gathering happen here, in the training thread); under
  // --async-checkpoint it returns once the state is staged in host memory, and its time counts as blocked.
  void save(TrainingPosition position);
  void write_checkpoint(TrainingPosition position);
  // --async-checkpoint: waits for this rank's write in flight and agrees with every rank that theirs
  // succeeded (collective: every rank calls it at the same boundary); a failure anywhere throws on every
  // rank. Then rank 0 hands over the file that names the shards of the last sharded save, which may
  // appear only now that every shard is on disk.
  void settle_checkpoint_writes();
  // settle_checkpoint_writes, then waits for what it handed over: the run's end, its last checkpoint, a
  // stop by signal. Collective. Nothing without --async-checkpoint.
  void finish_checkpoint_writes();
  // The epoch's running totals summed over the ranks (a collective: every rank calls it).
  RunningTotals reduced_totals() const;
  // Reads the divergence watch and hands what it found to stop_rules_. Every rank calls it together.
  void check_divergence();
  // Whether every rank's parameters (and masters, shards) and buffers are finite. Collective.
  bool state_is_finite();
  // The divergence check, then whether the state is finite (collective); false: nothing may be saved (said).
  bool fit_to_save(int64_t global_step);
  void load_model_state(const io::NamedTensors& saved);
  // Refuses a checkpoint this run has nothing left to train after; warns when the schedule's settings changed.
  void resume_from(Checkpoint ckpt);
  // Which flag set the run's last step: "--max-steps 40", or "--epochs 2 of 8 steps at --train-limit 64".
  std::string run_length_source() const;
  // Devices sharing each step: processes x the replicas each drives. --batch-size counts per device.
  int64_t devices() const { return strategy_->world_size() * strategy_->replicas(); }
  // One training sample as the model sees it: [channels, height, width] after any resize, or [tokens].
  std::vector<int64_t> sample_shape() const;
  // The devices of this process: the plan's device and, under dp, the ones after it.
  std::vector<torch::Device> local_devices() const;

  const Plan& plan_;
  const config::TrainConfig& c_;
  torch::Device device_;
  precision::PrecisionPolicy policy_;
  TrainHooks hooks_;
  std::unique_ptr<strategies::Strategy> strategy_;
  // Stop signals, --stop-at-step (a paused run saves where it is and ends, its schedule untouched, so that a
  // resume continues bit for bit) and --on-divergence: whether the run ends early, and how.
  StopRules stop_rules_;
  Progress::Style progress_style_;

  data::Dataset train_set_, test_set_;
  std::unique_ptr<data::Loader> train_loader_, test_loader_;
  std::shared_ptr<models::Model> model_;
  std::string fp8_summary_;  // --precision fp8: which layers run in FP8, for the run's header
  std::string model_summary_;  // the model as built, before a strategy flattens or shards it
  std::unique_ptr<strategies::UpdateTarget> target_;  // what the optimizer updates on this rank
  std::unique_ptr<Optimizer> optimizer_;
  std::optional<precision::LossScaler> scaler_;
  std::unique_ptr<LrSchedule> schedule_;
  std::unique_ptr<RunningTotals> totals_;
  std::unique_ptr<DivergenceWatch> divergence_;
  std::optional<metrics::GpuSampler> sampler_;  // CUDA runs: NVML's utilisation and memory of the devices
  std::unique_ptr<Checkpointer> checkpointer_;  // with --checkpoint-dir
  // --async-checkpoint, rank 0 of a sharded save: its checkpoint file, staged, to write once every rank's
  // shard is known written (settle_checkpoint_writes).
  std::optional<std::pair<std::string, Checkpoint>> pending_checkpoint_;
  // The training thread inside each save() and in finish_checkpoint_writes(): what checkpoints cost the steps.
  struct CheckpointBlocking {
    std::vector<double> saves;
    std::vector<double> waits;  // the part of each save spent waiting for the write before it
    double end_wait = 0;
    double total() const;
  } checkpoint_blocking_;
  const metrics::Stopwatch run_clock_;
  bool evaluating_ = false;    // inside evaluate(), after the epoch's checkpoint: the trained state is whole
  bool trained_ = false;       // the last step is done and its checkpoint and --save-weights are written
  bool weights_exported_ = false;  // --save-weights written (by rank 0; the other ranks only gather)
  bool weights_refused_ = false;   // --save-weights not written: the weights were not finite

  int64_t steps_per_epoch_ = 0, total_steps_ = 0, global_step_ = 0;
  int64_t micro_batches_per_epoch_ = 0;  // the last step's window of them may be shorter than --grad-accum
  int64_t epochs_ = 0;                   // --epochs, or the epochs --max-steps takes (run_steps)
  TrainingPosition start_;
  ThroughputClock clock_;
  RunFlops flops_;  // the model's FLOPs and the device's peak: TFLOP/s and MFU, set by announce()
  int64_t classes_ = 0;  // the model's classes: its logits may be wider (a padded vocabulary)
  int64_t cpu_bytes_before_model_ = 0;  // CPU runs: held by tensors once the data is loaded
  std::optional<metrics::PhasePeaks> phase_peaks_;  // with hooks_.on_step_memory: the step's memory by phase
  metrics::RunRecord record_;

  metrics::StepPhaseTimer phases_;
  std::unique_ptr<StepRunner> steps_;  // made by announce(), once the run knows whether it captures its steps
  torch::Tensor step_loss_;  // the step's summed micro-batch losses, for the library's on_step hook only
  ProfilerWindow profiler_;  // --profile-out's steps
  std::unique_ptr<metrics::ScalarLog> scalar_log_;  // rank 0, with --tensorboard or --log-jsonl
  torch::Tensor last_grad_norm_;  // the last step's gradient norm before clipping, when logged
};

}  // namespace ptrain::train
