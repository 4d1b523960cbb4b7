// The model-state memory a strategy predicts for one device, by ZeRO's arithmetic (Rajbhandari et al.
// 2020) on a parameter count: what `ptrain estimate`, `--dry-run` and the trainer's out-of-memory advice
// say. (What a run holds is counted from its tensors: UpdateTarget::model_state_bytes.)
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include <c10/core/ScalarType.h>

#include "ptrain/precision/policy.h"
#include "ptrain/strategy_spec/strategy_spec.h"

namespace ptrain::strategies {

// Per device, in bytes.
struct ModelStates {
  int64_t params = 0, grads = 0, optimizer = 0, masters = 0, buffers = 0;  // buffers: communication
  int64_t total() const { return params + grads + optimizer + masters + buffers; }
};

// How one device's model states are laid out: a strategy over `devices` devices, with what it offloads.
struct StateLayout {
  StrategySpec strategy;
  int64_t devices = 1;
  bool offload_optimizer = false;  // zero1-3: the optimizer state (and its fp32 masters) on the CPU
  bool offload_params = false;     // fsdp: the parameter shards, their gradients and the step on the CPU
  int64_t shard_group = 0;         // fsdp hybrid-shard*: ranks of one shard group; 0: all devices
  // The strategy's name, "+offload" when the optimizer state is offloaded: "zero3+offload".
  std::string label() const { return strategy.name() + (offload_optimizer ? "+offload" : ""); }
};

// The model states one device holds under `layout` for `parameters` parameters, dtype sizes from the
// precision policy; optimizer_slots: the optimizer's state tensors a parameter has (train::OptimizerOptions::slots).
// cpu: dp's replicas share the host's memory.
inline ModelStates predicted_model_states(const StateLayout& layout, int64_t parameters,
                                          const precision::PrecisionPolicy& policy,
                                          int64_t optimizer_slots, bool cpu) {
  const auto size = [](c10::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); };
  const auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const auto& strategy = layout.strategy;
  const int64_t n = std::max<int64_t>(layout.devices, 1);
  const int64_t param_bytes = parameters * size(policy.param_dtype);
  // With master weights the optimizer works on fp32 copies, gradients included; its state takes their dtype.
  const int64_t optimized_bytes = policy.master_weights ? parameters * size(policy.master_dtype) : param_bytes;

  ModelStates full;
  full.params = param_bytes;
  full.grads = param_bytes;
  full.optimizer = optimizer_slots * optimized_bytes;
  full.masters = policy.master_weights ? 2 * optimized_bytes : 0;  // the copy and its gradient

  ModelStates s = full;
  if (strategy.drives_several_devices()) {
    // One process holds every replica's parameters and gradients when the replicas share its memory (CPU);
    // on GPUs the first device holds what one GPU run does (plus the gathered outputs, negligible).
    if (cpu) {
      s.params *= n;
      s.grads *= n;
    }
    return s;
  }
  if (!strategy.multi_process()) return s;
  if (!strategy.shards_optimizer_state()) {
    s.buffers = full.grads;  // the flat gradient buckets the all-reduce works on (ddp, fsdp no-shard)
    return s;
  }
  if (strategy.is_fsdp()) {
    // FSDP's sharding strategies in ZeRO's terms: the sharding ones hold what zero3 does over the ranks of
    // one shard group; shard-grad-op keeps every unit's gathered parameters from forward to backward, so its
    // peak holds them whole; parameter offload moves the shards and the optimizer step to the CPU.
    StateLayout zero3;
    zero3.strategy = StrategySpec(StrategyKind::zero3);
    zero3.devices = layout.shard_group > 0 ? layout.shard_group : n;
    zero3.offload_optimizer = layout.offload_params;
    s = predicted_model_states(zero3, parameters, policy, optimizer_slots, cpu);
    if (layout.offload_params) s.params = s.grads = 0;
    if (!strategy.reshards_after_forward()) s.buffers = full.params;
    return s;
  }
  // ZeRO: stage 1 shards the optimizer state (and the fp32 masters it steps), stage 2 the gradients too,
  // stage 3 the parameters too.
  const bool offload = layout.offload_optimizer;
  s.optimizer = offload ? 0 : ceil_div(full.optimizer, n);
  s.masters = offload ? 0 : ceil_div(full.masters, n);
  if (strategy.shards_gradients()) s.grads = ceil_div(full.grads, n);
  if (strategy.shards_parameters()) s.params = ceil_div(full.params, n);
  return s;
}

}  // namespace ptrain::strategies
