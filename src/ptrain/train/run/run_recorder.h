// The run's metrics record (metrics/run_record.h, documented in docs/metrics.md): what the run learns of itself
// as it goes (the model as built, its model states, the transforms, each epoch), then, once training has ended,
// the facts the other parts measured and decided, turned into throughput, memory peaks, utilisation, accuracy,
// what ran and where. Every record a run writes, finished or stopped, is the one it holds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "ptrain/metrics/gpu_sampler.h"
#include "ptrain/metrics/memory.h"
#include "ptrain/metrics/run_record.h"
#include "ptrain/models/model.h"
#include "ptrain/train/run_flops.h"
#include "ptrain/train/throughput_clock.h"

namespace ptrain::train {

class RunRecorder {
 public:
  // What the record says once training has ended: the other parts' facts, read by the run where it ends.
  struct Facts {
    // What ran, and on what.
    std::string model, dataset, precision, strategy;
    torch::Device device = torch::kCPU;
    std::vector<torch::Device> local_devices;  // this process's: the plan's device and, under dp, the ones after
    int64_t world_size = 1, devices = 1;       // processes, and devices sharing each step
    int64_t batch_size = 0, grad_accum = 1;    // per device, micro-batches a step
    int64_t epochs = 0, steps = 0;             // the run's epochs, and the optimizer steps done
    int64_t steps_per_epoch = 0, micro_batches_per_epoch = 0;
    int64_t image_size = 0;  // 0 for tokens
    int64_t seq_len = 0;     // a token dataset's tokens a sample, 0 for images
    double total_wall_seconds = 0;
    const ThroughputClock* clock = nullptr;
    const RunFlops* flops = nullptr;
    // Memory and utilisation: the step's phase peaks (estimate's probes) and NVML's readings, where taken.
    const metrics::PhasePeaks* phase_peaks = nullptr;
    std::optional<metrics::GpuSampler::Stats> gpu_stats;
    std::optional<double> final_test_loss, final_test_accuracy;
    // What computed it.
    models::Model* trained_model = nullptr;  // its kernels and fusions as the last training forward took them
    bool channels_last = false, cuda_graphs = false;
    std::string optimizer_implementation;
    bool fused_kernels = false;     // --fused-kernels
    bool fused_available = false;   // this device has ptrain's fused kernels
    bool relu_recompute = false;    // --relu-recompute
    std::vector<std::string> skip_fusions;
    nlohmann::json step_phase_seconds, config;
    std::optional<int64_t> diverged_at_step;
    bool streamed_data = false;  // images decoded as they are read, not held in memory
    int64_t loader_threads = 0;
    double loader_wait_seconds = 0;
    bool warns = false;  // this rank prints the warnings (the main one)
  };

  explicit RunRecorder(std::string command_line);

  // CPU runs: what the run's tensors held before its model, once the data is loaded; the peak counts above it.
  void count_cpu_from_here();
  int64_t cpu_bytes_before_model() const { return cpu_bytes_before_model_; }

  // The model as built (before a strategy flattens or shards it) and, under --precision fp8, its FP8 layers:
  // the record's model_summary and fp8_layers, and the lines the run's header prints.
  void note_model(std::string summary_line, nlohmann::json summary);
  void note_fp8(std::string summary_line, nlohmann::json layers);
  const std::string& model_summary() const { return model_summary_; }
  const std::string& fp8_summary() const { return fp8_summary_; }
  // This rank's model states, in bytes.
  void note_model_states(int64_t params, int64_t grads, int64_t optimizer);
  void note_cuda_graphs(std::string note) { record_.cuda_graphs_note = std::move(note); }
  void note_data_transforms(nlohmann::json transforms) { record_.extra["data_transforms"] = std::move(transforms); }
  void add_epoch(const metrics::EpochRecord& epoch) { record_.epochs_detail.push_back(epoch); }
  // extra.run_end: how the run ended.
  void note_run_end(nlohmann::json run_end) { record_.extra["run_end"] = std::move(run_end); }

  // Everything measured and decided, once training has ended.
  void fill(const Facts& facts);

  // For other parts' own sections of the record (the checkpoints' costs).
  metrics::RunRecord& record() { return record_; }
  const metrics::RunRecord& record() const { return record_; }

 private:
  void record_what_ran_and_how_fast(const Facts& facts);
  void record_memory_and_utilisation(const Facts& facts);
  void record_implementation(const Facts& facts);

  metrics::RunRecord record_;
  std::string model_summary_, fp8_summary_;
  int64_t cpu_bytes_before_model_ = 0;
};

}  // namespace ptrain::train
