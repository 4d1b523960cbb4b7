// What the run measures and shows while it trains, and nothing it computes with: the run's wall clock, the
// progress style, the throughput clock and the run's FLOPs (TFLOP/s, MFU), the step phases' timer and, for
// ptrain estimate's probes, the step's memory phase by phase, NVML's sampler of the GPUs, --profile-out's
// trace and the scalars of --tensorboard and --log-jsonl. The loop tells it where the run is; the record
// reads what it measured.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "ptrain/metrics/gpu_sampler.h"
#include "ptrain/metrics/memory.h"
#include "ptrain/metrics/run_record.h"
#include "ptrain/metrics/scalar_log.h"
#include "ptrain/metrics/step_phases.h"
#include "ptrain/metrics/timer.h"
#include "ptrain/train/progress.h"
#include "ptrain/train/run/profiler_window.h"
#include "ptrain/train/run_flops.h"
#include "ptrain/train/step_runner.h"
#include "ptrain/train/throughput_clock.h"

namespace ptrain::train {

class RunMonitor {
 public:
  struct Options {
    torch::Device device = torch::kCPU;
    bool is_main = true;  // the rank that writes the scalar logs and says where the trace went
    Progress::Style progress_style = Progress::Style::Lines;
    std::string tensorboard, log_jsonl;  // "" for none
    std::string profile_out;             // "" for none
    int64_t profile_first_step = 0, profile_last_step = 0;
    // The library's callers following the run (TrainHooks): each step's epoch, global step and mean loss; and
    // for ptrain estimate's probes, each step's memory phase by phase (which keeps every step eager).
    std::function<void(int64_t epoch, int64_t step, double loss)> on_step;
    std::function<void(int64_t step, int64_t forward_backward_bytes, int64_t update_bytes)> on_step_memory;
  };
  // What a progress read logs besides the window's loss and rates: values of the parts that own them.
  struct StepScalars {
    double lr = 0;
    std::optional<double> loss_scale, grad_norm;
    bool tokens = false;  // a language model's rate counts tokens, an image model's images
  };

  explicit RunMonitor(Options options);

  // Since the run began: what the record's total_wall_seconds counts.
  const metrics::Stopwatch& run_clock() const { return run_clock_; }
  Progress progress(int64_t epochs, int64_t steps_per_epoch) const;

  // CUDA runs: NVML samples the utilisation and memory of these devices while the run trains, their
  // allocators' peaks reset first. Nothing elsewhere.
  void start_gpu_sampler(const std::vector<torch::Device>& devices);
  void stop_gpu_sampler();
  const metrics::GpuSampler* gpu_sampler() const { return sampler_ ? &*sampler_ : nullptr; }

  // Whether a caller follows each step: reading its loss waits for the device, so only then.
  bool follows_steps() const { return static_cast<bool>(options_.on_step); }
  void report_step(int64_t epoch, int64_t step, double loss) { options_.on_step(epoch, step, loss); }
  // The step's memory phase by phase, with on_step_memory, counted from what the run held before its model
  // (cpu_baseline, CPU runs); the step reports it to step_memory_hook(). Without it phase_peaks() is null.
  void track_phase_memory(int64_t cpu_baseline);
  const std::function<void(int64_t, int64_t, int64_t)>& step_memory_hook() const { return options_.on_step_memory; }
  metrics::PhasePeaks* phase_peaks() { return phase_peaks_ ? &*phase_peaks_ : nullptr; }
  const metrics::PhasePeaks* phase_peaks() const { return phase_peaks_ ? &*phase_peaks_ : nullptr; }

  metrics::StepPhaseTimer& phases() { return phases_; }
  ThroughputClock& clock() { return clock_; }
  const ThroughputClock& clock() const { return clock_; }
  // The model's FLOPs and the device's peak, once the model is built.
  void set_flops(RunFlops flops) { flops_ = std::move(flops); }
  const RunFlops& flops() const { return flops_; }

  // --profile-out: before step `step` runs (its batches' loading included), after it ran, and at the run's end.
  void trace_before_step(int64_t step) { profiler_.before_step(step); }
  void trace_after_step(int64_t step) { profiler_.after_step(step); }
  void finish_trace(int64_t last_step_done) { profiler_.finish(last_step_done); }

  // After optimizer step `step`: the steady clock starts where planned (waiting for the device first), and
  // on the CPU, where a step's work is done when it returns, the host's clock times each step.
  void after_step(int64_t step, StepRunner& steps);
  // Takes the step phases measured since the last call into the totals; where the host has waited anyway.
  void collect_step_phases(StepRunner& steps);

  // --tensorboard and --log-jsonl, opened by the main rank once the run knows the step it continues after
  // (resumed_after; none for a fresh run).
  void open_scalar_log(std::optional<int64_t> resumed_after);
  bool logging() const { return scalar_log_ != nullptr; }
  // The scalars of a progress read (the window's mean loss and rates) and of an epoch's end, after `step`.
  void log_progress(int64_t step, double epochs_done, double mean_loss, double samples_per_second,
                    double predictions_per_second, const StepScalars& step_scalars);
  void log_epoch(int64_t step, double epochs_done, const metrics::EpochRecord& epoch_record);
  // The logs that could not be written and were given up, for the run's end.
  std::vector<std::string> logs_given_up() const;

 private:
  Options options_;
  const metrics::Stopwatch run_clock_;
  std::optional<metrics::GpuSampler> sampler_;
  std::optional<metrics::PhasePeaks> phase_peaks_;
  metrics::StepPhaseTimer phases_;
  ThroughputClock clock_;
  RunFlops flops_;
  ProfilerWindow profiler_;
  std::unique_ptr<metrics::ScalarLog> scalar_log_;  // main rank, with --tensorboard or --log-jsonl
};

}  // namespace ptrain::train
