// `ptrain estimate`: the memory a training run needs on each device, before it runs, for every strategy,
// with advice on which one fits. Model states (parameters, gradients, optimizer state, fp32 master
// weights, communication buffers) follow each strategy's arithmetic; the rest is measured by two probes,
// short real training runs of the same model and precision at two small batches, in this process, each
// step read phase by phase:
// - the forward and backward passes: what grows with the batch (activations, the batch itself), the
//   probes' difference giving the bytes per sample, and a fixed rest (workspaces);
// - the update: the optimizer step's transient tensors (LibTorch's foreach AdamW holds several per
//   parameter), which set a small batch's peak and would hide its activations in a run's single peak.
// A device's peak is its model states plus the larger of the two. Measured peaks are the allocator's (CUDA
// caching allocator; on the CPU the counting allocator of metrics/cpu_allocator.h), so the prediction
// compares with a run's peak_allocated_bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptrain/config/train_config.h"
#include "ptrain/precision/policy.h"
#include "ptrain/strategies/model_state_arithmetic.h"
#include "ptrain/strategy_spec/strategy_spec.h"
#include "ptrain/train/plan.h"

namespace ptrain::estimate {

// The arithmetic is the strategies' own (strategies/model_state_arithmetic.h).
using strategies::ModelStates;
using strategies::StateLayout;

// The layout a plan trains with, over `devices` devices.
StateLayout configured_layout(const train::Plan& plan, int64_t devices);

struct StrategyEstimate {
  std::string strategy;   // StateLayout::label(): single, dp, ddp, zero1, zero2, zero3, zero3+offload, fsdp
  int64_t devices = 1;
  ModelStates states;
  int64_t activations = 0;  // bytes per sample x the per-device batch
  int64_t fixed = 0;        // measured rest of the forward and backward: workspaces, batches in flight
  int64_t update = 0;       // the update's transient bytes, for the optimizer state this device steps
  int64_t total = 0;        // the predicted peak_allocated_bytes: states + max(activations + fixed, update)
  bool fits = false;
};

struct MemoryEstimate {
  std::string model, precision, device;
  int64_t parameters = 0;
  int64_t batch_size = 0;  // per device
  std::optional<int64_t> capacity_bytes;  // the device's memory (host RAM for the CPU)
  struct Probe {
    int64_t batch = 0;
    int64_t peak = 0;               // the run's peak_allocated_bytes
    int64_t forward_backward = 0;   // the highest of its steps' forward and backward passes
    int64_t update = 0;             // the highest of its steps' updates
  };
  std::vector<Probe> probes;
  int64_t bytes_per_sample = 0, fixed_bytes = 0;
  int64_t update_bytes = 0;  // one device's update, above the model states
  std::string configured_strategy;
  std::vector<StrategyEstimate> strategies;
  std::string advice;
  // Set where the numbers are for a device this machine cannot run (a CUDA device, the probes on the CPU).
  std::string note;
};

// The model states one device holds under `layout` (the arithmetic alone). parameters: the model's
// parameter count; dtype sizes from the precision policy; the optimizer's slots from its kind (sgd with
// momentum: 1, adamw: 2). cpu: dp's replicas share the host's memory.
ModelStates model_states(const StateLayout& layout, int64_t parameters, const precision::PrecisionPolicy& precision,
                         const train::OptimizerOptions& optimizer, bool cpu);
// The same for a row name of the estimate ("zero3+offload"), the precision and fsdp's sharding from the
// config as --precision and --fsdp-sharding give them.
ModelStates model_states(const std::string& strategy, int64_t devices, int64_t parameters,
                         const config::TrainConfig& config, bool cpu);

// Runs the probes and predicts every strategy over `devices` devices, the plan's own among them. The
// probes train the plan's model in the plan's precision on one device.
MemoryEstimate estimate_memory(const train::Plan& plan, int64_t devices);
// The same for the plan train::make_plan makes of the config. Throws ptrain::Error for a config that
// cannot train (naming the key) or a probe that fails.
MemoryEstimate estimate_memory(const config::TrainConfig& config, int64_t devices);

std::string render_estimate(const MemoryEstimate& estimate);
nlohmann::json to_json(const MemoryEstimate& estimate);

}  // namespace ptrain::estimate
