#include "ptrain/bench/estimate.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include <torch/torch.h>

#include "ptrain/core/error.h"
#include "ptrain/metrics/memory.h"
#include "ptrain/precision/policy.h"
#include "ptrain/train/plan.h"
#include "ptrain/train/trainer.h"

namespace ptrain::bench {

namespace {

int64_t element_size(c10::ScalarType type) { return static_cast<int64_t>(c10::elementSize(type)); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string gib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return text;
}

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

// One short real training run (two optimizer steps, so the optimizer state exists at the second step's
// peak) at `batch` per device on one device; returns its record, allocator peak checked present.
metrics::RunRecord probe(const config::TrainConfig& config, int64_t batch) {
  config::TrainConfig probe = config;
  probe.run.strategy = "single";
  probe.run.batch_size = batch;
  probe.run.global_batch_size = 0;
  probe.run.epochs = 1;
  probe.run.max_steps = 2;
  probe.run.eval_each_epoch = false;
  probe.run.checkpoint_dir.clear();
  probe.run.checkpoint_every = 0;
  probe.run.resume.clear();
  probe.run.metrics_out.clear();
  probe.run.progress = "none";
  probe.run.dry_run = false;
  probe.data.train_limit = 2 * batch * probe.optim.grad_accum;
  probe.data.test_limit = batch;
  probe.dist.replicas = 0;
  const train::Plan plan = train::make_plan(probe);
  const auto record = train::train(plan, "ptrain estimate (probe at batch " + std::to_string(batch) + ")");
  check(record.peak_allocated_bytes.has_value() && record.model_state_param_bytes.has_value(),
        "ptrain estimate: the probe run on " + plan.device.str() + " measured no allocator peak");
  return record;
}

bool fits(int64_t total, const std::optional<int64_t>& capacity, bool cpu) {
  if (!capacity) return true;
  // CUDA: the caching allocator reserves more than tensors hold (about a tenth here), and the context
  // takes about half a GiB. The CPU: leave the rest of the host its share.
  const double needed = cpu ? static_cast<double>(total) / 0.8 : static_cast<double>(total) * 1.1 + (512ll << 20);
  return needed <= static_cast<double>(*capacity);
}

std::optional<int64_t> device_capacity(const torch::Device& device) {
  try {
    return device.is_cuda() ? metrics::cuda_device_total_bytes(device.index()) : metrics::host_total_bytes();
  } catch (const Error&) {
    return std::nullopt;
  }
}

}  // namespace

ModelStates model_states(const std::string& strategy, int64_t devices, int64_t parameters,
                         const config::TrainConfig& config, bool cpu) {
  const auto policy = precision::resolve_precision(config.precision.precision, config.precision.master_weights,
                                                   cpu ? c10::DeviceType::CPU : c10::DeviceType::CUDA,
                                                   config.precision.loss_scale);
  const int64_t n = std::max<int64_t>(devices, 1);
  const int64_t param_bytes = parameters * element_size(policy.param_dtype);
  // With master weights the optimizer works on fp32 copies, gradients included; its state takes their dtype.
  const int64_t optimized_bytes = policy.master_weights ? parameters * element_size(policy.master_dtype) : param_bytes;
  const int64_t slots = config.optim.name == "adamw" ? 2 : (config.optim.momentum > 0 ? 1 : 0);

  ModelStates full;
  full.params = param_bytes;
  full.grads = param_bytes;
  full.optimizer = slots * optimized_bytes;
  full.masters = policy.master_weights ? 2 * optimized_bytes : 0;  // the copy and its gradient

  ModelStates s = full;
  if (strategy == "single") return s;
  if (strategy == "dp") {
    // One process holds every replica's parameters and gradients when the replicas share its memory (CPU);
    // on GPUs the first device holds what one GPU run does (plus the gathered outputs, negligible).
    if (cpu) {
      s.params *= n;
      s.grads *= n;
    }
    return s;
  }
  if (strategy == "ddp") {
    s.buffers = full.grads;  // the flat gradient buckets the all-reduce works on
    return s;
  }
  if (strategy == "fsdp") {
    // FSDP's sharding strategies in ZeRO's terms: no-shard holds what ddp does (its flat gradients are the
    // buckets), the others what zero3 does over the ranks of one shard group; shard-grad-op keeps every
    // unit's gathered parameters from forward to backward, so its peak holds them whole; parameter
    // offload moves the shards and the optimizer step to the CPU.
    const auto& h = config.sharding;
    if (h.fsdp_sharding == "no-shard") {
      s.buffers = full.grads;
      return s;
    }
    const int64_t shards = h.fsdp_sharding.rfind("hybrid", 0) == 0 && h.hybrid_group_size > 0 ? h.hybrid_group_size : n;
    s = model_states(h.offload_params ? "zero3+offload" : "zero3", shards, parameters, config, cpu);
    if (h.offload_params) s.params = s.grads = 0;
    if (h.fsdp_sharding == "shard-grad-op" || h.fsdp_sharding == "hybrid-shard-zero2") s.buffers = full.params;
    return s;
  }
  // ZeRO (DeepSpeed's arithmetic, Rajbhandari et al. 2020): stage 1 shards the optimizer state (and the
  // fp32 masters it steps), stage 2 the gradients too, stage 3 the parameters too.
  const bool offload = strategy.size() > 5 && strategy.substr(5) == "+offload";
  const std::string stage = strategy.substr(0, 5);
  check(stage == "zero1" || stage == "zero2" || stage == "zero3",
        "ptrain estimate: no memory arithmetic for strategy '" + strategy + "'");
  s.optimizer = offload ? 0 : ceil_div(full.optimizer, n);
  s.masters = offload ? 0 : ceil_div(full.masters, n);
  if (stage != "zero1") s.grads = ceil_div(full.grads, n);
  if (stage == "zero3") s.params = ceil_div(full.params, n);
  return s;
}

MemoryEstimate estimate_memory(const config::TrainConfig& config, int64_t devices) {
  check(devices >= 1, "ptrain estimate: --devices must be at least 1");
  // Refuses a config that cannot train, by its key. The probes run on one device whatever the strategy.
  config::TrainConfig one_device = config;
  one_device.run.strategy = "single";
  one_device.dist.replicas = 0;
  const train::Plan plan = train::make_plan(one_device);
  const bool cpu = !plan.device.is_cuda();

  MemoryEstimate e;
  e.model = config.model.name;
  e.precision = plan.precision.name + (plan.precision.master_weights ? "+master" : "");
  e.device = plan.device.str();
  e.batch_size = config.run.batch_size;
  e.configured_strategy = config.run.strategy;
  e.capacity_bytes = device_capacity(plan.device);

  // Two probes at small batches; their difference is what one more sample costs. Large enough that
  // activations, not gradients, set the peak; small enough to be quick. The first probe's model states
  // also count the trainable parameters, in their training dtype.
  const int64_t small = std::max<int64_t>(2, std::min<int64_t>(config.run.batch_size / 8, 16));
  for (const int64_t batch : {small, 2 * small}) {
    const metrics::RunRecord record = probe(config, batch);
    if (e.probes.empty()) e.parameters = *record.model_state_param_bytes / element_size(plan.precision.param_dtype);
    e.probes.emplace_back(batch, *record.peak_allocated_bytes);
  }
  const auto [b1, p1] = e.probes[0];
  const auto [b2, p2] = e.probes[1];
  e.bytes_per_sample = std::max<int64_t>(0, (p2 - p1) / (b2 - b1));
  const ModelStates single = model_states("single", 1, e.parameters, config, cpu);
  e.fixed_bytes = std::max<int64_t>(0, p1 - e.bytes_per_sample * b1 - single.total());

  const int64_t n = std::max<int64_t>(devices, 1);
  std::vector<std::pair<std::string, int64_t>> layouts{{"single", 1}, {"dp", n}, {"ddp", n}, {"zero1", n},
                                                       {"zero2", n}, {"zero3", n}, {"zero3+offload", n},
                                                       {"fsdp", n}};
  for (const auto& [strategy, count] : layouts) {
    StrategyEstimate s;
    s.strategy = strategy;
    s.devices = count;
    s.states = model_states(strategy, count, e.parameters, config, cpu);
    const int64_t replicas_here = (cpu && strategy == "dp") ? count : 1;
    s.activations = e.bytes_per_sample * config.run.batch_size * replicas_here;
    s.fixed = e.fixed_bytes;
    s.total = s.states.total() + s.activations + s.fixed;
    s.fits = fits(s.total, e.capacity_bytes, cpu);
    e.strategies.push_back(s);
  }

  // The usual decision flow: one device if it fits (ddp to go faster on several); when the model states
  // do not fit, shard them (ZeRO-2, then ZeRO-3 or FSDP full-shard); then offload.
  const auto find = [&](const std::string& name) -> const StrategyEstimate& {
    return *std::find_if(e.strategies.begin(), e.strategies.end(), [&](const auto& s) { return s.strategy == name; });
  };
  const std::string where = cpu ? "the host" : "one GPU";
  std::ostringstream advice;
  if (find("single").fits) {
    advice << "Fits on " << where << " (" << gib(find("single").total) << ")";
    if (n > 1) advice << "; with " << n << " devices, ddp is the fastest way to use them (" << gib(find("ddp").total) << " each)";
    advice << ".";
  } else if (find("ddp").fits) {
    advice << "ddp fits (" << gib(find("ddp").total) << " per device).";
  } else if (find("zero2").fits) {
    advice << "Model states do not fit replicated: shard them with zero2 over " << n << " devices ("
           << gib(find("zero2").total) << " each).";
  } else if (find("zero3").fits) {
    advice << "Shard the parameters too: zero3 (or fsdp full-shard) over " << n << " devices ("
           << gib(find("zero3").total) << " each).";
  } else if (find("zero3+offload").fits) {
    advice << "Even zero3 does not fit: offload the optimizer state to the CPU (zero3 --offload-optimizer, "
           << gib(find("zero3+offload").total) << " per device).";
  } else {
    advice << "Nothing fits: activations take " << mib(e.bytes_per_sample) << " a sample; lower --batch-size, "
           << "turn on --activation-checkpointing, or use more devices.";
  }
  e.advice = advice.str();
  return e;
}

std::string render_estimate(const MemoryEstimate& e) {
  std::ostringstream out;
  out << "memory estimate: " << e.model << " (" << e.parameters << " parameters), " << e.precision << ", batch "
      << e.batch_size << " per device, on " << e.device;
  if (e.capacity_bytes) out << " (" << gib(*e.capacity_bytes) << ")";
  out << "\n";
  out << "measured: ";
  for (size_t i = 0; i < e.probes.size(); ++i)
    out << (i ? ", " : "") << "batch " << e.probes[i].first << " peaks at " << mib(e.probes[i].second);
  out << " -> " << mib(e.bytes_per_sample) << " a sample, " << mib(e.fixed_bytes) << " fixed\n\n";
  out << "| strategy | devices | parameters | gradients | optimizer | masters | buffers | activations | fixed | per device | fits |\n";
  out << "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n";
  for (const auto& s : e.strategies) {
    out << "| " << s.strategy << (s.strategy == e.configured_strategy ? " (configured)" : "") << " | " << s.devices
        << " | " << mib(s.states.params) << " | " << mib(s.states.grads) << " | " << mib(s.states.optimizer) << " | "
        << mib(s.states.masters) << " | " << mib(s.states.buffers) << " | " << mib(s.activations) << " | "
        << mib(s.fixed) << " | " << gib(s.total) << " | " << (s.fits ? "yes" : "no") << " |\n";
  }
  out << "\n" << e.advice << "\n";
  return out.str();
}

nlohmann::json to_json(const MemoryEstimate& e) {
  nlohmann::json strategies = nlohmann::json::array();
  for (const auto& s : e.strategies) {
    strategies.push_back({{"strategy", s.strategy},
                          {"devices", s.devices},
                          {"params_bytes", s.states.params},
                          {"grads_bytes", s.states.grads},
                          {"optimizer_bytes", s.states.optimizer},
                          {"masters_bytes", s.states.masters},
                          {"buffers_bytes", s.states.buffers},
                          {"activation_bytes", s.activations},
                          {"fixed_bytes", s.fixed},
                          {"predicted_peak_allocated_bytes", s.total},
                          {"fits", s.fits}});
  }
  nlohmann::json probes = nlohmann::json::array();
  for (const auto& [batch, peak] : e.probes) probes.push_back({{"batch", batch}, {"peak_allocated_bytes", peak}});
  return {{"model", e.model},
          {"parameters", e.parameters},
          {"precision", e.precision},
          {"device", e.device},
          {"batch_size_per_device", e.batch_size},
          {"capacity_bytes", e.capacity_bytes ? nlohmann::json(*e.capacity_bytes) : nlohmann::json(nullptr)},
          {"probes", probes},
          {"bytes_per_sample", e.bytes_per_sample},
          {"fixed_bytes", e.fixed_bytes},
          {"configured_strategy", e.configured_strategy},
          {"strategies", strategies},
          {"advice", e.advice}};
}

}  // namespace ptrain::bench
