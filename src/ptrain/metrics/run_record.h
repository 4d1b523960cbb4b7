// The one metrics record a training run writes, whatever its precision and strategy: the basis of
// every comparison. Field names, units and null rules are documented in docs/metrics.md (a test
// compares that table with to_json's keys).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace ptrain::metrics {

constexpr int64_t kRunRecordSchemaVersion = 1;

// Who trained the run: bench/pytorch_reference.py writes the same record so that both sit in one report.
inline constexpr char kFrameworkPtrain[] = "ptrain";
inline constexpr char kFrameworkPytorch[] = "pytorch";

struct EpochRecord {
  int64_t epoch = 0;
  double wall_seconds = 0.0;
  double train_loss = 0.0;
  std::optional<double> train_accuracy;
  std::optional<double> test_loss;
  std::optional<double> test_accuracy;
  double images_per_second = 0.0;
  int64_t images = 0;
};

struct RunRecord {
  std::string framework = kFrameworkPtrain;  // kFrameworkPtrain or kFrameworkPytorch
  std::string ptrain_version, torch_version, command_line, model, dataset, precision, strategy, device;
  int64_t world_size = 1;
  int64_t devices = 1;
  int64_t batch_size_per_device = 0;
  int64_t global_batch_size = 0;
  int64_t epochs = 0;
  int64_t steps = 0;
  int64_t image_size = 0;
  double total_wall_seconds = 0.0;
  double train_wall_seconds = 0.0;
  double images_per_second = 0.0;  // training only, excluding evaluation
  // Throughput once warm: from the end of step steady_from_step on (the first steps autotune kernels and
  // grow allocator pools), which short runs need to compare like with like. Null when the run was too short.
  std::optional<double> steady_images_per_second;
  std::optional<int64_t> steady_from_step;
  // The steady steps one by one, so that a figure says how much it wobbled: seconds a step, one entry per
  // step where the host's clock sees each step end (steady_step_timing "step": the CPU, whose work is done
  // when the step returns), else one entry per stretch between the synchronisations the run makes anyway
  // ("window": its seconds over its steps; on CUDA a progress read every --log-every steps and each epoch's
  // end), so that measuring adds no wait for the device. Their median, 10th and 90th percentiles (linear
  // between ranks, as numpy's) beside them. Empty, "" and null where no steady step ran, and in older records.
  std::vector<double> steady_step_seconds;
  std::string steady_step_timing;
  std::optional<double> steady_step_median_seconds, steady_step_p10_seconds, steady_step_p90_seconds;
  // Language models: tokens per training sequence, and the throughputs above in tokens (sequences count as
  // images there). Null for image models.
  std::optional<int64_t> seq_len;
  std::optional<double> tokens_per_second, steady_tokens_per_second;
  // Model FLOP utilisation (metrics/flops.h): the model's matrix products and convolutions in one optimizer step
  // (forward x 3, the global batch), the model TFLOP/s each device did (steady when measured), and that over
  // peak_tflops, the device's dense peak for the run's precision, whose source peak_tflops_basis names. Null where
  // the model cannot count its FLOPs (TorchScript, a user's module) or no peak is known (a CPU, an unlisted GPU).
  std::optional<double> model_flops_per_step, tflops, mfu, peak_tflops;
  std::string peak_tflops_basis;
  // How the step ran (with channels_last below): the model through torch.compile (PyTorch records; null in
  // ptrain's, which do not use it); the optimizer step as one fused kernel. Null in records before the fields.
  std::optional<bool> compiled, fused_optimizer;
  std::optional<int64_t> peak_allocated_bytes, peak_reserved_bytes, peak_nvml_used_bytes;
  std::optional<double> gpu_util_mean, gpu_util_peak;
  int64_t host_peak_rss_bytes = 0;
  // Rank 0's model state between steps (parameters, gradients, optimizer state incl. fp32 masters):
  // what the ZeRO stages shard. Null in records that predate them or come from PyTorch.
  std::optional<int64_t> model_state_param_bytes, model_state_grad_bytes, model_state_optimizer_bytes;
  std::optional<double> final_test_accuracy, final_test_loss;
  // How the step ran: NHWC or not, whether steps replayed a captured CUDA graph (and why not, when not), which
  // kernels ran ({"optimizer": "fused" | "foreach", "cross_entropy": "fused" | "reference"}), and the mean
  // seconds a steady step spent in each phase (data, forward, backward, optimizer, communication). Null or
  // empty where unknown: PyTorch records, and records written before the fields existed.
  std::optional<bool> channels_last;
  std::optional<bool> cuda_graphs;
  std::string cuda_graphs_note;
  nlohmann::json kernels = nlohmann::json::object();
  nlohmann::json step_phase_seconds = nullptr;
  // The first step whose loss was not finite (or whose loss scale hit its floor) in a run that trained on
  // (--on-divergence warn): its accuracy and losses mean nothing. Null for a run that did not diverge.
  std::optional<int64_t> diverged_at_step;
  // The cost of checkpoints to the training thread: seconds it spent saving (the whole write when synchronous;
  // under --async-checkpoint staging the state and waiting for the write before), and under --async-checkpoint
  // the seconds the background writes took. Null without --checkpoint-dir (blocking), or when saves are
  // synchronous (write), and in records written before the fields.
  std::optional<double> checkpoint_blocking_seconds, checkpoint_write_seconds;
  std::vector<EpochRecord> epochs_detail;
  nlohmann::json environment = nlohmann::json::object();  // gpu name, driver, cuda, cudnn, nccl when known
  nlohmann::json extra = nlohmann::json::object();
};

// The q-th quantile (0..1) of values, linear between the two nearest ranks (numpy's default), so that ptrain
// and bench/pytorch_reference.py agree; nullopt for no values.
std::optional<double> quantile(std::vector<double> values, double q);
// Sets steady_step_seconds and timing, and the median, p10 and p90 from them (null when there are none).
void set_steady_steps(RunRecord& record, std::vector<double> seconds, std::string timing);

// Optional values become JSON null; so do non-finite doubles (JSON has no NaN), e.g. a diverged loss.
nlohmann::json to_json(const EpochRecord& record);
nlohmann::json to_json(const RunRecord& record);

// Throws ptrain::Error naming the key when a field is missing or has the wrong type, or when
// schema_version is not kRunRecordSchemaVersion. A null in a non-optional double reads as NaN.
// Records without "framework" are ptrain's; a PyTorch record may lack ptrain_version.
RunRecord run_record_from_json(const nlohmann::json& json);

// Writes to a temporary file beside path, then renames it over path: a reader never sees half a
// record, and a crash leaves the previous file. Throws ptrain::Error naming the path on failure.
void write_run_record(const std::string& path, const RunRecord& record);

}  // namespace ptrain::metrics
