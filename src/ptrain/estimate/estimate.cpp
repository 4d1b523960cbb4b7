#include "ptrain/estimate/estimate.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <sstream>

#include <torch/torch.h>

#include "ptrain/core/error.h"
#include "ptrain/core/text.h"
#include "ptrain/estimate/run_length.h"
#include "ptrain/metrics/memory.h"
#include "ptrain/precision/policy.h"
#include "ptrain/strategy_spec/strategy_spec.h"
#include "ptrain/train/plan.h"
#include "ptrain/train/trainer.h"

namespace ptrain::estimate {

namespace {

int64_t element_size(c10::ScalarType type) { return static_cast<int64_t>(c10::elementSize(type)); }

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

struct ProbeRun {
  metrics::RunRecord record;
  MemoryEstimate::Probe memory;
};

// One short real training run (two optimizer steps, so the optimizer state exists at the second step's
// peak) at `batch` per device on one device, in the plan's precision, its steps read phase by phase;
// allocator peak checked present. The probe's plan is the user's, resolved already, on one process and device,
// keeping and writing nothing.
ProbeRun probe(const train::Plan& plan, int64_t batch) {
  train::Plan probe_plan = plan;
  probe_plan.strategy = strategies::StrategySpec();
  probe_plan.strategy_options = strategies::StrategyOptions{};
  probe_plan.launch = distributed::LaunchEnvironment{};
  probe_plan.length = {/*epochs=*/1, /*max_steps=*/2, plan.length.grad_accum, batch};
  // The user's plan is checked against its own length (estimate_for); a schedule sized for it (a warm-up of 10
  // steps, milestones) would not fit the probes' two steps, and the learning rate changes no memory.
  auto& schedule = probe_plan.optimization.schedule;
  schedule.kind = train::ScheduleKind::kConstant;
  schedule.warmup_epochs = 0;
  schedule.warmup_steps = 0;
  schedule.milestones.clear();
  probe_plan.cadence.eval_each_epoch = false;
  probe_plan.cadence.stop_at_step = 0;
  probe_plan.checkpoints = train::CheckpointOptions{};
  probe_plan.reporting = train::Reporting{};
  probe_plan.reporting.progress = "none";
  probe_plan.model.save_weights.clear();
  probe_plan.resume_path.clear();
  probe_plan.resume_note.clear();
  probe_plan.restart = distributed::RestartInfo{};
  probe_plan.restart_note.clear();
  probe_plan.data_options.train_limit = 2 * batch * plan.length.grad_accum;
  probe_plan.data_options.test_limit = batch;
  ProbeRun run;
  run.memory.batch = batch;
  train::TrainHooks hooks;
  hooks.on_step_memory = [&run](const train::StepMemory& step) {
    run.memory.forward_backward = std::max(run.memory.forward_backward, step.forward_backward_bytes);
    run.memory.update = std::max(run.memory.update, step.update_bytes);
  };
  run.record = train::train(probe_plan, "ptrain estimate (probe at batch " + std::to_string(batch) + ")", hooks);
  check(run.record.peak_allocated_bytes.has_value() && run.record.model_state_param_bytes.has_value(),
        "ptrain estimate: the probe run on " + probe_plan.device.str() + " measured no allocator peak");
  run.memory.peak = *run.record.peak_allocated_bytes;
  return run;
}

// The share of the update's transient bytes a device under `states` holds: they come with the optimizer
// state (and fp32 masters) it steps, a ZeRO shard of them, none where they are offloaded.
double update_share(const ModelStates& states, const ModelStates& single) {
  const int64_t stepped = single.optimizer + single.masters;
  return stepped > 0 ? static_cast<double>(states.optimizer + states.masters) / static_cast<double>(stepped) : 1.0;
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

StateLayout configured_layout(const train::Plan& plan, int64_t devices) {
  const strategies::StrategyOptions& o = plan.strategy_options;
  StateLayout layout;
  layout.strategy = plan.strategy;
  layout.devices = plan.strategy.multi_process() || plan.strategy.drives_several_devices() ? devices : 1;
  layout.offload_optimizer = plan.strategy.can_offload_optimizer() && o.offload_optimizer;
  layout.offload_params = plan.strategy.can_offload_params() && o.offload_params;
  layout.shard_group = plan.strategy.hybrid() ? o.hybrid_group_size : 0;
  return layout;
}

ModelStates model_states(const StateLayout& layout, int64_t parameters, const precision::PrecisionPolicy& policy,
                         const train::OptimizerOptions& optimizer, bool cpu) {
  return strategies::predicted_model_states(layout, parameters, policy, optimizer.slots(), cpu);
}

ModelStates model_states(const std::string& strategy, int64_t devices, int64_t parameters,
                         const config::TrainConfig& config, bool cpu) {
  std::string sharded = strategy;
  const bool offload = remove_suffix(sharded, "+offload");
  StateLayout layout;
  layout.strategy = strategies::StrategySpec::parse(sharded, config.sharding.fsdp_sharding);
  check(!offload || layout.strategy.can_offload_optimizer(),
        "ptrain estimate: no memory arithmetic for strategy '" + strategy + "'");
  layout.devices = devices;
  layout.offload_optimizer = offload;
  layout.offload_params = layout.strategy.can_offload_params() && config.sharding.offload_params;
  layout.shard_group = layout.strategy.hybrid() ? config.sharding.hybrid_group_size : 0;
  const auto policy = precision::resolve_precision(config.precision.precision, config.precision.master_weights,
                                                   cpu ? c10::DeviceType::CPU : c10::DeviceType::CUDA,
                                                   config.precision.loss_scale);
  return model_states(layout, parameters, policy, train::optimizer_options(config.optim), cpu);
}

namespace {
// cuda_target: the arithmetic is a CUDA device's, wherever the plan's probes run.
MemoryEstimate estimate_for(const train::Plan& plan, int64_t devices, bool cuda_target);
}  // namespace

MemoryEstimate estimate_memory(const config::TrainConfig& config, int64_t devices) {
  check(devices >= 1, "ptrain estimate: --devices must be at least 1");
  config::TrainConfig planned = config;
  // dp's replicas are the estimate's --devices: one is enough for the plan to check the rest.
  const auto spec = strategies::StrategySpec::parse(config.run.strategy, config.sharding.fsdp_sharding);
  if (spec.drives_several_devices() && planned.dist.replicas == 0) planned.dist.replicas = 1;
  // Estimating needs no GPU: for a CUDA device this machine cannot use (a LibTorch without CUDA, no GPU
  // visible) the model states are a CUDA device's arithmetic and the probes run on the CPU, in a mode of
  // the same sizes the CPU has (bf16 for fp16, fp32 for tf32).
  const bool cuda_elsewhere = config.run.device.rfind("cuda", 0) == 0 && !torch::cuda::is_available();
  precision::PrecisionPolicy target;
  if (cuda_elsewhere) {
    target = precision::resolve_precision(config.precision.precision, config.precision.master_weights,
                                          c10::DeviceType::CUDA, config.precision.loss_scale);
    const auto half = precision::half_dtype(target.mode);
    planned.run.device = "cpu";
    planned.precision.precision = precision::to_string(
        half ? precision::half_mode(c10::ScalarType::BFloat16, precision::autocasts(target.mode)) : precision::PrecisionMode::FP32);
    // fp8's probes run as amp-bf16 there, where --fp8-head and --fp8-scaling mean nothing.
    planned.precision.fp8_head = false;
    planned.precision.fp8_scaling = "dynamic";
  }
  const train::Plan plan = train::make_plan(planned);
  if (!cuda_elsewhere) return estimate_memory(plan, devices);
  MemoryEstimate e = estimate_for(plan, devices, /*cuda_target=*/true);
  e.device = config.run.device;
  e.precision = precision::record_name(target);
  e.note = "estimated for " + config.run.device + ", which this machine cannot run (this LibTorch has no CUDA, "
           "or no GPU is visible): the model states are a CUDA device's arithmetic, the activations were measured on the CPU" +
           (plan.precision.mode == target.mode ? "" : " in " + plan.precision.name) +
           " and may differ on the GPU (cuDNN workspaces); its memory is unknown here. --device cpu "
           "estimates for this machine's CPU";
  return e;
}

MemoryEstimate estimate_memory(const train::Plan& plan, int64_t devices) {
  return estimate_for(plan, devices, plan.device.is_cuda());
}

namespace {

MemoryEstimate estimate_for(const train::Plan& plan, int64_t devices, bool cuda_target) {
  using strategies::StrategySpec;
  check(devices >= 1, "ptrain estimate: --devices must be at least 1");
  const bool cpu = !cuda_target;
  const train::OptimizerOptions& optimizer = plan.optimization.optimizer;
  const StateLayout configured = configured_layout(plan, devices);
  // The user's run, not the probes': one that cannot train on its data (a batch larger than it, a warm-up
  // longer than the run) has no memory to predict.
  run_length(plan.length, plan.optimization.schedule, training_samples(plan.data, plan.data_options),
             plan.strategy.multi_process() ? devices : 1, plan.strategy.drives_several_devices() ? devices : 1);

  MemoryEstimate e;
  e.model = plan.model.name;
  e.precision = precision::record_name(plan.precision);
  e.device = plan.device.str();
  e.batch_size = plan.length.batch_size;
  e.configured_strategy = configured.label();
  if (cuda_target == plan.device.is_cuda()) e.capacity_bytes = device_capacity(plan.device);

  // Two probes; the difference of their forward-and-backward peaks is what one more sample costs. That peak
  // is the highest over the pass of the states then live plus the activations then live, which grows faster
  // with the batch once activations outweigh the states (its moment moves from late backward, gradients all
  // allocated, to the end of forward), so a slope read at small batches only is low: GPT-tiny's read at 16
  // and 32 predicted 83% of batch 256's peak. The second probe at a quarter of the run's batch keeps the
  // extrapolation short at a cost of half a step of the run; the first stays small to be quick. The first
  // probe's model states also count the trainable parameters, in their training dtype.
  const int64_t small = std::max<int64_t>(2, std::min<int64_t>(plan.length.batch_size / 8, 16));
  for (const int64_t batch : {small, std::max(2 * small, plan.length.batch_size / 4)}) {
    const ProbeRun run = probe(plan, batch);
    if (e.probes.empty())
      e.parameters = *run.record.model_state_param_bytes / element_size(plan.precision.param_dtype);
    e.probes.push_back(run.memory);
  }
  const auto& [b1, peak1, fb1, update1] = e.probes[0];
  const auto& [b2, peak2, fb2, update2] = e.probes[1];
  e.bytes_per_sample = std::max<int64_t>(0, (fb2 - fb1) / (b2 - b1));
  const ModelStates single = model_states(StateLayout{}, e.parameters, plan.precision, optimizer, cpu);
  e.fixed_bytes = std::max<int64_t>(0, fb1 - e.bytes_per_sample * b1 - single.total());
  e.update_bytes = std::max<int64_t>(0, std::max(update1, update2) - single.total());

  // Every strategy over n devices (fsdp with the plan's sharding), those whose descriptor asks for it with
  // the optimizer state offloaded too, and the plan's own layout where it is none of them (zero2 with
  // --offload-optimizer, say).
  const int64_t n = std::max<int64_t>(devices, 1);
  std::vector<StateLayout> layouts;
  for (const auto& spec : StrategySpec::all(plan.strategy.fsdp_sharding())) {
    StateLayout l;
    l.strategy = spec;
    l.devices = spec.multi_process() || spec.drives_several_devices() ? n : 1;
    l.offload_params = spec.offloads_optimizer_with_params() && plan.strategy_options.offload_params;
    l.shard_group = spec.hybrid() ? plan.strategy_options.hybrid_group_size : 0;
    layouts.push_back(l);
    if (strategies::descriptor(spec).estimate_offloaded) {
      l.offload_optimizer = true;
      layouts.push_back(l);
    }
  }
  if (std::none_of(layouts.begin(), layouts.end(), [&](const StateLayout& l) { return l.label() == configured.label(); }))
    layouts.push_back(configured);
  for (const auto& l : layouts) {
    StrategyEstimate s;
    s.strategy = l.label();
    s.devices = l.devices;
    s.states = model_states(l, e.parameters, plan.precision, optimizer, cpu);
    const int64_t replicas_here = (cpu && l.strategy.drives_several_devices()) ? l.devices : 1;
    s.activations = e.bytes_per_sample * plan.length.batch_size * replicas_here;
    s.fixed = e.fixed_bytes;
    s.update = static_cast<int64_t>(static_cast<double>(e.update_bytes) * update_share(s.states, single));
    s.total = s.states.total() + std::max(s.activations + s.fixed, s.update);
    s.fits = fits(s.total, e.capacity_bytes, cpu);
    e.strategies.push_back(s);
  }

  // The usual decision flow, in the descriptors' order: one device if it fits (with several, the first
  // multi-process row that fits goes faster); when the model states do not fit, shard them (ZeRO-2, then
  // ZeRO-3 or FSDP full-shard); then offload.
  const std::string where = cpu ? "the host" : "one GPU";
  const auto advice_of = [&](const StateLayout& l) -> std::string {
    const auto& row = strategies::descriptor(l.strategy);
    return l.offload_optimizer ? row.advice_offloaded : row.advice;
  };
  const auto filled = [&](std::string text, const StrategyEstimate& row) {
    for (const auto& [key, value] : {std::pair<std::string, std::string>{"{where}", where},
                                     {"{n}", std::to_string(n)},
                                     {"{total}", gib(row.total)}}) {
      for (auto at = text.find(key); at != std::string::npos; at = text.find(key)) text.replace(at, key.size(), value);
    }
    return text;
  };
  // The first advised row that fits, rows without offload first; layouts.size() when none does.
  const auto first_fitting = [&](bool offloaded, const std::function<bool(const StateLayout&)>& also) {
    for (size_t i = 0; i < layouts.size(); ++i) {
      const auto& l = layouts[i];
      if (l.offload_optimizer == offloaded && !advice_of(l).empty() && e.strategies[i].fits && also(l)) return i;
    }
    return layouts.size();
  };
  const auto any = [](const StateLayout&) { return true; };
  size_t chosen = first_fitting(false, any);
  if (chosen == layouts.size()) chosen = first_fitting(true, any);
  std::ostringstream advice;
  if (!e.capacity_bytes) {
    advice << "The device's memory is unknown here: compare it with each strategy's per-device total.";
  } else if (chosen < layouts.size()) {
    advice << filled(advice_of(layouts[chosen]), e.strategies[chosen]);
    const size_t faster = first_fitting(false, [](const StateLayout& l) { return l.strategy.multi_process(); });
    if (n > 1 && !layouts[chosen].strategy.multi_process() && faster < layouts.size()) {
      std::string text = advice.str();
      text.pop_back();  // the sentence goes on
      advice.str("");
      advice << text << "; with " << n << " devices, " << e.strategies[faster].strategy
             << " is the fastest way to use them (" << gib(e.strategies[faster].total) << " each).";
    }
  } else {
    advice << "Nothing fits: activations take " << mib(e.bytes_per_sample) << " a sample; lower --batch-size, "
           << "turn on --activation-checkpointing, or use more devices.";
  }
  e.advice = advice.str();
  return e;
}

}  // namespace

std::string render_estimate(const MemoryEstimate& e) {
  std::ostringstream out;
  out << "memory estimate: " << e.model << " (" << e.parameters << " parameters), " << e.precision << ", batch "
      << e.batch_size << " per device, on " << e.device;
  if (e.capacity_bytes) out << " (" << gib(*e.capacity_bytes) << ")";
  out << "\n";
  if (!e.note.empty()) out << "note: " << e.note << "\n";
  out << "measured: ";
  for (size_t i = 0; i < e.probes.size(); ++i)
    out << (i ? ", " : "") << "batch " << e.probes[i].batch << " peaks at " << mib(e.probes[i].forward_backward)
        << " in forward and backward, " << mib(e.probes[i].update) << " in the update";
  out << " -> " << mib(e.bytes_per_sample) << " a sample, " << mib(e.fixed_bytes) << " fixed, "
      << mib(e.update_bytes) << " transient in the update\n";
  out << "per device: the model states, plus activations and the fixed rest or the update's transient bytes, "
         "whichever is larger\n\n";
  out << "| strategy | devices | parameters | gradients | optimizer | masters | buffers | activations | fixed | update "
         "| per device | fits |\n";
  out << "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n";
  for (const auto& s : e.strategies) {
    out << "| " << s.strategy << (s.strategy == e.configured_strategy ? " (configured)" : "") << " | " << s.devices
        << " | " << mib(s.states.params) << " | " << mib(s.states.grads) << " | " << mib(s.states.optimizer) << " | "
        << mib(s.states.masters) << " | " << mib(s.states.buffers) << " | " << mib(s.activations) << " | "
        << mib(s.fixed) << " | " << mib(s.update) << " | " << gib(s.total) << " | " << (!e.capacity_bytes ? "?" : s.fits ? "yes" : "no") << " |\n";
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
                          {"update_bytes", s.update},
                          {"predicted_peak_allocated_bytes", s.total},
                          {"fits", s.fits}});
  }
  nlohmann::json probes = nlohmann::json::array();
  for (const auto& p : e.probes)
    probes.push_back({{"batch", p.batch},
                      {"peak_allocated_bytes", p.peak},
                      {"forward_backward_peak_bytes", p.forward_backward},
                      {"update_peak_bytes", p.update}});
  return {{"model", e.model},
          {"parameters", e.parameters},
          {"precision", e.precision},
          {"device", e.device},
          {"batch_size_per_device", e.batch_size},
          {"capacity_bytes", e.capacity_bytes ? nlohmann::json(*e.capacity_bytes) : nlohmann::json(nullptr)},
          {"probes", probes},
          {"bytes_per_sample", e.bytes_per_sample},
          {"fixed_bytes", e.fixed_bytes},
          {"update_bytes", e.update_bytes},
          {"configured_strategy", e.configured_strategy},
          {"strategies", strategies},
          {"advice", e.advice},
          {"note", e.note.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.note)}};
}

}  // namespace ptrain::estimate
