#include "ptrain/train/plan.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>

#include "ptrain/config/near_names.h"
#include "ptrain/config/number_checks.h"
#include "ptrain/config/settings_in_effect.h"
#include "ptrain/core/cuda_runtime.h"
#include "ptrain/core/error.h"
#include "ptrain/core/text.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/distributed/cpu_threads.h"
#include "ptrain/io/output_path.h"
#include "ptrain/models/torchscript_model.h"
#include "ptrain/models/zoo.h"
#include "ptrain/train/checkpoint.h"

namespace ptrain::train {

torch::Device resolve_device(const std::string& name) {
  if (name == "auto") return torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  torch::Device device = torch::kCPU;
  try {
    device = torch::Device(name);
  } catch (const c10::Error&) {
    throw Error("--device: '" + name + "' is not a device (use auto, cpu, cuda or cuda:N)");
  }
  check(device.is_cpu() || device.is_cuda(), "--device: only cpu and cuda are supported, not '" + name + "'");
  if (device.is_cuda()) {
    cuda_runtime::require_cuda_build("--device " + name);
    check(torch::cuda::is_available(), "--device " + name + ": no CUDA device is visible");
    const int64_t index = device.has_index() ? device.index() : 0;
    check(index < static_cast<int64_t>(torch::cuda::device_count()),
          "--device " + name + ": only " + std::to_string(torch::cuda::device_count()) + " CUDA device(s) visible");
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  return device;
}

namespace {

// --initial-loss-scale, --loss-scale-window, --hysteresis, --consecutive-hysteresis and --min-loss-scale
// shape a dynamic scale; given (not at their defaults) without one, they are refused.
void apply_loss_scaling_rules(const config::PrecisionConfig& p, precision::PrecisionPolicy& policy) {
  const config::PrecisionConfig defaults;
  const bool customised = p.initial_loss_scale != defaults.initial_loss_scale ||
                          p.loss_scale_window != defaults.loss_scale_window || p.hysteresis != defaults.hysteresis ||
                          p.consecutive_hysteresis != defaults.consecutive_hysteresis ||
                          p.min_loss_scale != defaults.min_loss_scale;
  check(!customised || (policy.loss_scaling && policy.dynamic_loss_scale),
        "--initial-loss-scale, --loss-scale-window, --hysteresis, --consecutive-hysteresis and --min-loss-scale "
        "shape dynamic loss scaling, which --precision " + policy.name + " with --loss-scale " + p.loss_scale +
            " does not use");
  check(p.min_loss_scale <= p.initial_loss_scale, "--min-loss-scale must not exceed --initial-loss-scale");
  policy.initial_loss_scale = p.initial_loss_scale;
  policy.loss_scale_window = p.loss_scale_window;
  policy.hysteresis = p.hysteresis;
  policy.consecutive_hysteresis = p.consecutive_hysteresis;
  policy.min_loss_scale = p.min_loss_scale;
}

// The dynamic scale's rules where they differ from GradScaler's (a DeepSpeed fp16 block sets them).
std::string loss_scale_rules(const precision::PrecisionPolicy& p) {
  const precision::PrecisionPolicy defaults;
  if (!p.loss_scaling || !p.dynamic_loss_scale) return "";
  if (p.initial_loss_scale == defaults.initial_loss_scale && p.loss_scale_window == defaults.loss_scale_window &&
      p.hysteresis == defaults.hysteresis && p.min_loss_scale == defaults.min_loss_scale)
    return "";
  std::ostringstream out;
  out << " (initial " << p.initial_loss_scale << ", window " << p.loss_scale_window << ", hysteresis " << p.hysteresis
      << (p.hysteresis > 1 ? (p.consecutive_hysteresis ? " consecutive" : " per window") : "") << ", floor "
      << p.min_loss_scale << ")";
  return out.str();
}

}  // namespace

namespace {

// FSDP's MixedPrecision policy on ptrain's precision modes: param_dtype X keeps fp32 shards for the
// optimizer (master weights) and runs forward and backward on X parameters, with autocast as well when
// the precision mode has it; gradients travel in reduce_dtype; buffers follow the parameters.
void apply_fsdp_mixed_precision(const config::TrainConfig& c, Plan& plan) {
  const auto& h = c.sharding;
  if (!h.param_dtype.empty() && precision::dtype_named(h.param_dtype) != torch::kFloat) {
    const auto wanted = precision::dtype_named(h.param_dtype);
    auto& p = plan.precision;
    if (p.param_dtype == torch::kFloat && !p.autocast && p.mode != precision::PrecisionMode::TF32) {
      // fp32 with param_dtype X is FSDP's way to say: X compute on fp32 master shards.
      auto resolved = precision::resolve_precision(h.param_dtype, /*master_weights=*/true, plan.device.type(),
                                                   c.precision.loss_scale);
      apply_loss_scaling_rules(c.precision, resolved);
      p = resolved;
    } else {
      check(!p.autocast || p.autocast_dtype == wanted,
            "--param-dtype " + h.param_dtype + " with --precision " + p.name + ": autocast runs in another dtype");
      check(p.autocast || p.param_dtype == wanted || p.param_dtype == torch::kFloat,
            "--param-dtype " + h.param_dtype + " with --precision " + p.name + ": the parameters are in another dtype");
      p.param_dtype = wanted;
      if (!p.autocast) p.compute_dtype = wanted;
      p.master_weights = true;
      p.master_dtype = torch::kFloat;
    }
  }
  const auto params = plan.precision.param_dtype;
  check(h.buffer_dtype.empty() || precision::dtype_named(h.buffer_dtype) == params,
        "--buffer-dtype " + h.buffer_dtype + ": ptrain keeps buffers (BatchNorm statistics) in the parameters' dtype, " +
            precision::dtype_name(params) + " in this run");
}

// Convolutional models run NHWC on CUDA unless told otherwise: cuDNN's fastest convolution, batch-norm and
// pooling kernels for half types are NHWC ones (1.85x on ResNet-50 in amp-bf16 on an H200). Language models
// have no 4-D tensors for the format to change, so asking for it there is refused rather than ignored.
bool resolve_channels_last(const config::TrainConfig& c, const torch::Device& device) {
  const bool convolutional = !models::is_language_model(c.model.name);
  if (c.model.channels_last == "auto") return convolutional && device.is_cuda();
  check(c.model.channels_last == "true" || c.model.channels_last == "false",
        "--channels-last: expected auto, true or false, got '" + c.model.channels_last + "'");
  const bool wanted = c.model.channels_last == "true";
  check(!wanted || convolutional, "--channels-last applies to convolutional models, not to --model " + c.model.name +
                                      " (it has no 4-D tensors to lay out)");
  return wanted;
}

// "ddp, zero1, zero2, zero3 or fsdp": the strategies whose processes train one run together.
std::string multi_process_strategies() {
  std::vector<std::string> names;
  for (const auto& name : strategies::StrategySpec::names())
    if (strategies::StrategySpec::parse(name).multi_process()) names.push_back(name);
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) text += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return text;
}

// The strategy's flags in their types, checked here once: --auto-wrap, --backward-prefetch and the
// numbers FSDP's policy needs (a config file reaches here without the command line's checks).
void resolve_strategy_options(const config::TrainConfig& c, strategies::StrategyOptions& o) {
  const auto& h = c.sharding;
  o.backend = c.dist.backend;
  o.timeout_seconds = c.dist.timeout_seconds;
  o.bucket_cap_mb = c.dist.bucket_cap_mb;
  o.sync_batchnorm = c.dist.sync_batchnorm;
  o.overlap_comm = h.overlap_comm;
  o.reduce_bucket_mb = h.reduce_bucket_mb;
  o.offload_optimizer = h.offload_optimizer;
  o.offload_params = h.offload_params;
  o.auto_wrap = strategies::parse_auto_wrap(h.auto_wrap);
  o.min_num_params = h.min_num_params;
  o.wrap_types = h.wrap_types;
  o.backward_prefetch = strategies::parse_backward_prefetch(h.backward_prefetch);
  o.forward_prefetch = h.forward_prefetch;
  o.sync_module_states = h.sync_module_states;
  o.hybrid_group_size = h.hybrid_group_size;
  check(o.auto_wrap != strategies::AutoWrap::type || !o.wrap_types.empty(),
        "--auto-wrap type needs --wrap-types (the block class names to wrap)");
  check(o.auto_wrap != strategies::AutoWrap::size || o.min_num_params > 0, "--min-num-params must be positive");
  check(o.hybrid_group_size >= 0, "--hybrid-group-size must not be negative");
}

}  // namespace

std::pair<int64_t, int64_t> parse_step_range(const std::string& text, const std::string& flag) {
  const auto colon = text.find(':');
  const auto bad = [&]() {
    return Error(flag + " '" + text + "': expected A:B, optimizer steps from A to B (1 <= A <= B), e.g. 11:15");
  };
  if (colon == std::string::npos) throw bad();
  const auto number = [&](const std::string& part) {
    if (part.empty() || part.size() > 12 || part.find_first_not_of("0123456789") != std::string::npos) throw bad();
    return std::stoll(part);
  };
  const int64_t first = number(text.substr(0, colon)), last = number(text.substr(colon + 1));
  if (first < 1 || last < first) throw bad();
  return {first, last};
}

void check_fusion_names(const std::vector<std::string>& names, const std::string& where) {
  const auto& fusions = models::fusion_names();
  for (auto at = names.begin(); at != names.end(); ++at) {
    check(std::find(fusions.begin(), fusions.end(), *at) != fusions.end(),
          where + ": '" + *at + "' is not a fusion" + config::did_you_mean(*at, fusions) + " (the fusions: " +
              join(fusions, ", ") + ")");
    check(std::find(names.begin(), at, *at) == at, where + ": '" + *at + "' is named twice");
  }
}

namespace {

// --skip-fusions names fusions this run would take, each once, or is refused by name: with the fused kernels on; the
// weight casts under autocast (and not beside GPT's FP8 linears, which cast their own); GPT's bias gradients and
// residual adds on CUDA, its FP8 amax under --precision fp8 with dynamic scaling; the batch norms' three on
// CUDA in channels-last, without --sync-batchnorm's normalisation in their place. Whether the model has the fusion
// (a ResNet's ImageNet stem, its twins without activation checkpointing) the model itself answers, once built
// (models::Model::fusions).
void check_skipped_fusions(const config::TrainConfig& c, const Plan& plan) {
  check_fusion_names(c.run.skip_fusions, "--skip-fusions");
  for (const auto& fusion : c.run.skip_fusions) {
    const std::string flag = "--skip-fusions " + fusion;
    check(c.run.fused_kernels, flag + ": --no-fused-kernels already leaves every fusion out");
    const bool language = models::is_language_model(c.model.name);
    if (fusion == "weight-casts") {
      check(plan.precision.autocast, flag + ": --precision " + plan.precision.name + " casts no weight (no autocast)");
      check(!(language && plan.precision.fp8_matmuls),
            flag + ": under --precision fp8 GPT's FP8 linear layers cast their own weights, and nothing else does");
    } else if (fusion == "fp8-amax") {
      check(language, flag + ": only GPT's blocks take the FP8 casts' amax from their kernels, not --model " +
                          c.model.name + "'s");
      check(plan.precision.fp8_matmuls, flag + ": --precision " + plan.precision.name + " casts nothing to FP8");
      check(c.precision.fp8_scaling == "dynamic",
            flag + ": --fp8-scaling " + c.precision.fp8_scaling + " takes its scales from amax histories, recorded "
                   "in the cast's own pass");
      check(plan.device.is_cuda(), flag + ": the FP8 casts run on CUDA only, not on " + plan.device.str());
    } else if (fusion == "bias-gradients" || fusion == "residual-adds") {
      const std::string what = fusion == "bias-gradients" ? "the fused bias gradients" : "the deferred residual adds";
      check(language, flag + ": only GPT's blocks take " + what + ", not --model " + c.model.name + "'s");
      check(plan.device.is_cuda(), flag + ": " + what + " run on CUDA only, not on " + plan.device.str());
      check(fusion != "residual-adds" || !plan.strategy.needs_units(),
            flag + ": --strategy " + c.run.strategy + " runs the model a block at a time, each adding its own residual");
    } else {
      check(!language, flag + ": --model " + c.model.name +
                           " has no batch norms (its fusions: weight-casts, bias-gradients, residual-adds, fp8-amax)");
      check(plan.device.is_cuda(), flag + ": the batch norms' fused kernels run on CUDA only, not on " +
                                        plan.device.str());
      check(plan.channels_last, flag + ": the batch norms' fused kernels take channels-last activations, which "
                                       "--channels-last false turns off");
      check(!c.dist.sync_batchnorm, flag + ": --sync-batchnorm's synchronised batch norms run in place of the fused ones");
    }
  }
}

// Every path a run writes, in one check: writable, and no two of them one file (--save-weights x.pt
// --metrics-out x.pt left the record where the weights were) or a file among the checkpoints.
void check_outputs(const config::TrainConfig& c) {
  using Kind = io::OutputPath::Kind;
  io::check_outputs({{"--checkpoint-dir", c.run.checkpoint_dir, Kind::owned_directory},
                     {"--save-weights", c.model.save_weights, Kind::file},
                     {"--metrics-out", c.run.metrics_out, Kind::file},
                     {"--log-jsonl", c.run.log_jsonl, Kind::file},
                     {"--tensorboard", c.run.tensorboard, Kind::directory},
                     {"--profile-out", c.run.profile_out, Kind::whole_file}});
}

}  // namespace

OptimizerOptions optimizer_options(const config::OptimizerConfig& o) {
  check(o.name == "sgd" || o.name == "adamw", "--optimizer: unknown optimizer '" + o.name + "' (known: sgd, adamw)");
  OptimizerOptions options;
  options.kind = o.name == "adamw" ? OptimizerKind::adamw : OptimizerKind::sgd;
  options.lr = o.lr;
  options.momentum = o.momentum;
  options.nesterov = o.nesterov;
  options.weight_decay = o.weight_decay;
  options.beta1 = o.beta1;
  options.beta2 = o.beta2;
  options.eps = o.eps;
  return options;
}

ScheduleOptions schedule_options(const config::OptimizerConfig& o) {
  ScheduleOptions options;
  options.kind = schedule_kind(o.schedule);
  options.lr = o.lr;
  options.milestones = o.milestones;
  options.gamma = o.gamma;
  options.min_lr = o.min_lr;
  options.warmup_epochs = o.warmup_epochs;
  options.warmup_steps = o.warmup_steps;
  options.warmup_rise = warmup_rise(o.warmup_type);
  options.warmup_min_lr = o.warmup_min_lr;
  return options;
}

RunLength run_length_of(const config::TrainConfig& c) {
  return RunLength{c.run.epochs, c.run.max_steps, c.optim.grad_accum, c.run.batch_size};
}

data::DataSpec data_spec(const config::DataConfig& d) {
  data::DataSpec spec{d.dataset, d.path, d.seq_len};
  spec.image_loading = d.image_loading;
  spec.image_size = d.image_size;
  return spec;
}

DataOptions data_options(const config::DataConfig& d) {
  return DataOptions{d.loader_threads, d.prefetch, d.train_limit, d.test_limit, d.augment};
}

namespace {

// A restarted job continues from the newest checkpoint of the attempts before it, whatever --resume and
// --overwrite-checkpoints told its first attempt (which would start it over, or from an older state).
// Before the first checkpoint there is none: the attempt starts from where the first one did.
void resolve_restart(config::TrainConfig& c, Plan& plan) {
  plan.restart = distributed::detect_restart();
  if (plan.restart.count > 0 && !c.run.checkpoint_dir.empty()) {
    const std::string latest = std::filesystem::is_directory(c.run.checkpoint_dir)
                                   ? find_latest_checkpoint(c.run.checkpoint_dir).path : std::string();
    if (!latest.empty()) {
      c.run.resume = "latest";
      c.run.overwrite_checkpoints = false;
    }
    plan.restart_note = latest.empty() ? "no checkpoint in " + c.run.checkpoint_dir + " yet: training from the start"
                                       : "resuming from " + latest;
  } else if (plan.restart.count > 0) {
    plan.restart_note = "no --checkpoint-dir: training from the start";
  }
  if (!plan.restart_note.empty()) {
    const std::string cause = plan.restart.causes.empty() ? std::string() : " (" + plan.restart.causes.back() + ")";
    plan.restart_note = "restart " + std::to_string(plan.restart.count) + " of the job" + cause + ": " + plan.restart_note;
  }
}

// --strategy and the flags that only some strategies take, refused by name where the strategy takes none of them.
void resolve_strategy(const config::TrainConfig& c, Plan& plan) {
  plan.strategy = strategies::StrategySpec::parse(c.run.strategy, c.sharding.fsdp_sharding);
  const strategies::StrategySpec& s = plan.strategy;
  const std::string strategy = s.name();
  check(!c.sharding.offload_optimizer || s.can_offload_optimizer(),
        "--offload-optimizer applies to --strategy zero1, zero2 or zero3 only" +
            std::string(s.offloads_optimizer_with_params()
                            ? " (fsdp's --offload-params moves the optimizer step to the CPU too, as FSDP's CPU offload does)"
                            : ""));
  check(!c.sharding.offload_params || s.can_offload_params(),
        s.takes_fsdp_options()
            ? "--offload-params: --fsdp-sharding " + s.fsdp_sharding_name() +
                  " keeps every parameter on each rank's device; offload needs a strategy that shards them"
            : "--offload-params applies to --strategy zero3 and fsdp only (the others keep every parameter on each rank)");
  check(!s.uses_flat_groups() || !c.dist.sync_batchnorm, "--sync-batchnorm applies to --strategy ddp only");
  plan.strategy_options.state_dict = strategies::parse_state_dict(c.sharding.state_dict);
  check(s.saves_sharded() || plan.strategy_options.state_dict == strategies::StateDict::full,
        "--state-dict " + c.sharding.state_dict + ": --strategy " + strategy +
            " holds every parameter whole and writes full checkpoints; sharded ones are for zero1-3 and fsdp");
  config::refuse_settings_without_effect(c);
  check(s.takes_reduce_dtype() || c.sharding.reduce_dtype.empty(),
        "--reduce-dtype: --strategy " + strategy + " reduces gradients in the parameters' dtype (fsdp takes it)");
  if (!s.takes_fsdp_options()) {
    // FSDP's settings mean nothing to the other strategies: name the first one given.
    const config::ShardingConfig defaults;
    const auto& h = c.sharding;
    const std::vector<std::pair<bool, const char*>> fsdp_only = {
        {h.fsdp_sharding != defaults.fsdp_sharding, "--fsdp-sharding"},
        {h.auto_wrap != defaults.auto_wrap, "--auto-wrap"},
        {h.min_num_params != defaults.min_num_params, "--min-num-params"},
        {h.wrap_types != defaults.wrap_types, "--wrap-types"},
        {h.backward_prefetch != defaults.backward_prefetch, "--backward-prefetch"},
        {h.forward_prefetch != defaults.forward_prefetch, "--forward-prefetch"},
        {h.sync_module_states != defaults.sync_module_states, "--no-sync-module-states"},
        {h.param_dtype != defaults.param_dtype, "--param-dtype"},
        {h.buffer_dtype != defaults.buffer_dtype, "--buffer-dtype"},
        {h.hybrid_group_size != defaults.hybrid_group_size, "--hybrid-group-size"}};
    for (const auto& [given, flag] : fsdp_only)
      check(!given, std::string(flag) + " applies to --strategy fsdp only (this run's strategy is " + strategy + ")");
  }
  resolve_strategy_options(c, plan.strategy_options);
  check(s.hybrid() || c.sharding.hybrid_group_size == 0, "--hybrid-group-size applies to --fsdp-sharding hybrid-shard only");
}

// The processes and devices the run trains on: the launch environment, the device (a launched process's own
// GPU), dp's replicas, the threads, and --global-batch-size's batch per device.
void resolve_processes(config::TrainConfig& c, Plan& plan) {
  const strategies::StrategySpec& s = plan.strategy;
  const std::string strategy = s.name();
  if (s.multi_process()) {
    plan.launch = distributed::detect_environment();
    const distributed::LaunchEnvironment& env = plan.launch;
    // One process a GPU: an unindexed CUDA device means this process's local rank, as torchrun arranges it.
    if ((c.run.device == "auto" && torch::cuda::is_available()) || c.run.device == "cuda")
      c.run.device = "cuda:" + std::to_string(env.local_rank);
    check(c.dist.backend != "nccl" || c.run.device.rfind("cuda", 0) == 0, "--backend nccl needs a CUDA --device");
  } else {
    // Under a launcher every process would train the same run alone, and each would report it as the job's.
    const distributed::LaunchEnvironment env = distributed::detect_environment();
    check(env.world_size == 1, "--strategy " + strategy + " trains in one process, but " + distributed::rank_variables(env) +
                                   " make this one of " + std::to_string(env.world_size) +
                                   " processes, each of which would train the same run alone: choose --strategy " +
                                   multi_process_strategies() + ", or start one process");
    check(c.dist.backend.empty() && !c.dist.sync_batchnorm,
          "--backend and --sync-batchnorm apply to --strategy ddp only (--backend to zero1-3 too)" +
              std::string(s.drives_several_devices() ? " (PyTorch's SyncBatchNorm refuses DataParallel too)" : ""));
  }
  check(s.drives_several_devices() || c.dist.replicas == 0, "--replicas applies to --strategy dp only");
  plan.device = resolve_device(c.run.device);
  if (s.drives_several_devices()) {
    if (plan.device.is_cuda()) {
      const int64_t visible = static_cast<int64_t>(torch::cuda::device_count()) - plan.device.index();
      if (c.dist.replicas == 0) c.dist.replicas = visible;
      check(c.dist.replicas <= visible, "--replicas " + std::to_string(c.dist.replicas) + ": only " +
                                            std::to_string(visible) + " CUDA device(s) from " + plan.device.str());
    } else {
      check(c.dist.replicas > 0, "--strategy dp on the CPU needs --replicas N (how many CPU replicas to run)");
    }
  }
  const int64_t replicas = s.drives_several_devices() ? c.dist.replicas : 1;
  plan.strategy_options.replicas = c.dist.replicas;
  const char* omp_threads = std::getenv("OMP_NUM_THREADS");
  const std::string threads_source = c.run.threads > 0 ? "--threads " + std::to_string(c.run.threads)
                                     : omp_threads != nullptr && *omp_threads != '\0'
                                         ? "OMP_NUM_THREADS=" + std::string(omp_threads)
                                         : "1 thread";
  c.run.threads = distributed::intra_op_threads(c.run.threads, plan.launch.local_world_size, std::thread::hardware_concurrency());
  plan.threads_warning = distributed::oversubscription_warning(c.run.threads, threads_source, plan.launch.local_world_size,
                                                        std::thread::hardware_concurrency());
  if (c.run.global_batch_size > 0) {
    const int64_t devices = plan.launch.world_size * replicas;
    const int64_t per_step = devices * c.optim.grad_accum;
    check(c.run.global_batch_size % per_step == 0,
          "--global-batch-size " + std::to_string(c.run.global_batch_size) + " is not divisible by " +
              std::to_string(devices) + " devices x --grad-accum " + std::to_string(c.optim.grad_accum));
    c.run.batch_size = c.run.global_batch_size / per_step;
  }
}

void resolve_precision(const config::TrainConfig& c, Plan& plan) {
  plan.precision = precision::resolve_precision(c.precision.precision, c.precision.master_weights,
                                                plan.device.type(), c.precision.loss_scale);
  precision::require_fp8_device(plan.precision, plan.device);
  check(!c.precision.fp8_head || plan.precision.fp8_matmuls,
        "--fp8-head applies to --precision fp8 only, not to --precision " + plan.precision.name);
  check(c.precision.fp8_scaling == "dynamic" || plan.precision.fp8_matmuls,
        "--fp8-scaling " + c.precision.fp8_scaling + " applies to --precision fp8 only, not to --precision " +
            plan.precision.name);
  apply_loss_scaling_rules(c.precision, plan.precision);
  if (plan.strategy.takes_fsdp_options()) apply_fsdp_mixed_precision(c, plan);
  // Gradients travel in --reduce-dtype where the strategy takes it, else in the parameters' dtype.
  plan.precision.reduce_dtype = c.sharding.reduce_dtype.empty() ? plan.precision.param_dtype
                                                                : precision::dtype_named(c.sharding.reduce_dtype);
}

// --model and the flags that apply to some models or datasets only.
void check_model(const config::TrainConfig& c, bool model_from_caller) {
  const auto names = models::model_names();
  const bool scripted = models::is_torchscript_path(c.model.name);
  if (scripted) {
    check(std::filesystem::is_regular_file(c.model.name), "--model: no such TorchScript file: " + c.model.name);
    // Its BatchNorm layers are inside the scripted graph, where SyncBatchNorm cannot take their place.
    check(!c.dist.sync_batchnorm, "--sync-batchnorm: --model " + c.model.name +
                                      " is a TorchScript module, whose batch norms ptrain cannot replace by "
                                      "synchronised ones; train it without --sync-batchnorm");
  } else if (!model_from_caller && std::find(names.begin(), names.end(), c.model.name) == names.end()) {
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    throw Error("--model: unknown model '" + c.model.name + "' (known: " + known +
                "; or a TorchScript file ending in .pt)");
  }
  if (!models::is_language_model(c.model.name)) {
    for (const auto& [flag, value] : {std::pair<const char*, int64_t>{"--gpt-layers", c.model.gpt_layers},
                                      {"--gpt-width", c.model.gpt_width},
                                      {"--gpt-heads", c.model.gpt_heads},
                                      {"--vocab-size", c.model.vocab_size}}) {
      check(value == 0, std::string(flag) + " applies to GPT models only, not to --model " + c.model.name);
    }
  }
  check(c.data.seq_len == 0 || data::is_token_dataset(c.data.dataset),
        "--seq-len applies to token datasets (synthetic-tokens, text) only, not to --dataset " + c.data.dataset);
  if (!c.model.weights.empty())
    check(std::filesystem::is_regular_file(c.model.weights), "--weights: no such file: " + c.model.weights);
  if (!c.model.save_weights.empty()) {
    const auto ext = std::filesystem::path(c.model.save_weights).extension().string();
    check(ext == ".pt" || ext == ".pth" || ext == ".safetensors",
          "--save-weights " + c.model.save_weights + ": use a .pt or .pth (torch.load) or .safetensors file name");
  }
}

// The data, the layout it reaches the model in, the fusions the run leaves out and the steps it traces.
void resolve_data(const config::TrainConfig& c, Plan& plan) {
  plan.data = data_spec(c.data);
  plan.channels_last = resolve_channels_last(c, plan.device);
  check_skipped_fusions(c, plan);
  plan.reporting.profile_steps = c.run.profile_steps;
  if (!c.run.profile_out.empty()) {
    const auto [first, last] = parse_step_range(c.run.profile_steps, "--profile-steps");
    plan.reporting.profile_first_step = first;
    plan.reporting.profile_last_step = last;
  }
  check(c.data.normalize.empty() || !data::is_token_dataset(c.data.dataset),
        "--normalize applies to image datasets, not to the token dataset " + c.data.dataset);
  plan.normalization =
      c.data.normalize.empty() ? data::default_normalization(c.data.dataset) : data::parse_normalization(c.data.normalize);
}

// Checked here, not first when the schedule and the optimizer are built, so that --dry-run and estimate refuse
// what train refuses.
void check_optimization(const config::TrainConfig& c) {
  check(c.optim.milestones.empty() || c.optim.schedule == "step", "--milestones needs --schedule step");
  check(c.optim.warmup_steps == 0 || c.optim.warmup_epochs == 0, "--warmup-steps and --warmup-epochs exclude each other");
  check(c.optim.min_lr <= c.optim.lr, "--min-lr " + config::exact_number_text(c.optim.min_lr) +
                                          " must not exceed --lr " + config::exact_number_text(c.optim.lr));
  check(std::is_sorted(c.optim.milestones.begin(), c.optim.milestones.end()), "--milestones must be increasing");
  check(c.optim.name != "sgd" || !c.optim.nesterov || c.optim.momentum > 0, "--nesterov needs --momentum > 0");
  check(c.run.max_steps == 0 || c.optim.warmup_steps <= c.run.max_steps,
        "--warmup-steps " + std::to_string(c.optim.warmup_steps) + " is longer than the whole run (--max-steps " +
            std::to_string(c.run.max_steps) + ")");
}

// The checkpoints, the pause, --on-divergence and every output path.
void resolve_run_rules(const config::TrainConfig& c, Plan& plan) {
  check(c.run.checkpoint_every == 0 || !c.run.checkpoint_dir.empty(), "--checkpoint-every needs --checkpoint-dir");
  check(c.run.keep_checkpoints == 0 || !c.run.checkpoint_dir.empty(), "--keep-checkpoints needs --checkpoint-dir");
  check(!c.run.overwrite_checkpoints || !c.run.checkpoint_dir.empty(), "--overwrite-checkpoints needs --checkpoint-dir");
  check(!c.run.async_checkpoint || !c.run.checkpoint_dir.empty(), "--async-checkpoint needs --checkpoint-dir");
  check(!c.run.overwrite_checkpoints || c.run.resume.empty(),
        "--overwrite-checkpoints starts over and removes the checkpoints --resume " + c.run.resume + " would continue");
  check(c.run.on_divergence == "stop" || c.run.on_divergence == "warn",
        "--on-divergence: '" + c.run.on_divergence + "' (known: stop, warn)");
  plan.on_divergence = c.run.on_divergence == "warn" ? OnDivergence::kWarn : OnDivergence::kStop;
  // Without a checkpoint the pause keeps nothing: the steps trained would be lost behind exit status 0.
  check(c.run.stop_at_step == 0 || !c.run.checkpoint_dir.empty(),
        "--stop-at-step needs --checkpoint-dir: a paused run continues from its checkpoint, and without one "
        "the steps trained until the pause would be lost");
  // Outputs are checked now, not when the run first writes them after minutes or hours of training.
  check_outputs(c);
}

void resolve_resume(const config::TrainConfig& c, Plan& plan) {
  if (!c.run.resume.empty()) {
    if (c.run.resume == "latest") {
      check(!c.run.checkpoint_dir.empty(), "--resume latest needs --checkpoint-dir");
      const LatestCheckpoint latest = find_latest_checkpoint(c.run.checkpoint_dir);
      plan.resume_path = latest.path;
      check(!plan.resume_path.empty(), "--resume latest: no checkpoint in " + c.run.checkpoint_dir);
      const auto& passed = latest.passed_over;
      if (!passed.empty()) {
        const auto name = [](const std::string& path) { return std::filesystem::path(path).filename().string(); };
        plan.resume_note =
            "--resume latest: " + plan.resume_path + ", the newest checkpoint of the line written last; " +
            std::to_string(passed.size()) + " checkpoint(s) of later steps in " + c.run.checkpoint_dir +
            " belong to a branch abandoned by an earlier resume (" + name(passed.front()) +
            (passed.size() > 1 ? " .. " + name(passed.back()) : "") +
            "): left in place, never taken by latest; resume one by its path to return to that branch";
      }
    } else {
      check(std::filesystem::is_regular_file(c.run.resume), "--resume: no such file: " + c.run.resume);
      plan.resume_path = c.run.resume;
    }
  }
}

// The sections the run reads, once every value in the config is resolved.
void fill_sections(const config::TrainConfig& c, Plan& plan) {
  plan.settings = config::to_json(c);
  auto& m = plan.model;
  m.name = c.model.name;
  m.weights = c.model.weights;
  m.save_weights = c.model.save_weights;
  m.activation_checkpointing = c.model.activation_checkpointing;
  m.gpt_layers = c.model.gpt_layers;
  m.gpt_width = c.model.gpt_width;
  m.gpt_heads = c.model.gpt_heads;
  m.vocab_size = c.model.vocab_size;
  m.fused_kernels = c.run.fused_kernels;
  m.relu_recompute = c.run.relu_recompute;
  m.conv_bn_fusion = c.run.conv_bn_fusion;
  m.skip_fusions = c.run.skip_fusions;
  m.fp8 = {c.precision.fp8_head, c.precision.fp8_scaling == "delayed"};
  plan.data_options = data_options(c.data);
  plan.length = run_length_of(c);
  plan.optimization = {optimizer_options(c.optim), schedule_options(c.optim), c.optim.clip_grad_norm};
  plan.cadence = {c.run.seed, c.run.eval_batch_size, c.run.eval_each_epoch, c.run.log_every, c.run.stop_at_step};
  plan.checkpoints = {c.run.checkpoint_dir, c.run.checkpoint_every, c.run.keep_checkpoints,
                      c.run.overwrite_checkpoints, c.run.async_checkpoint};
  auto& r = plan.reporting;
  r.progress = c.run.progress;
  r.tensorboard = c.run.tensorboard;
  r.log_jsonl = c.run.log_jsonl;
  r.profile_out = c.run.profile_out;
  plan.device_setup = {c.run.threads, c.run.cudnn_benchmark, c.run.cuda_graphs};
  plan.precision_flags = {c.precision.loss_scale, c.sharding.param_dtype};
}

struct Resolved {
  config::TrainConfig config;
  Plan plan;
};

// make_plan's steps in order: each resolves what the next ones read (the strategy, then the device it trains on,
// then the precision on that device, ...) and refuses what it resolves by the flag's name.
Resolved resolve(const config::TrainConfig& given, bool model_from_caller) {
  Resolved resolved{given, Plan{}};
  config::TrainConfig& c = resolved.config;
  Plan& plan = resolved.plan;
  resolve_restart(c, plan);
  resolve_strategy(c, plan);
  resolve_processes(c, plan);
  resolve_precision(c, plan);
  check_model(c, model_from_caller);
  resolve_data(c, plan);
  check_optimization(c);
  resolve_run_rules(c, plan);
  resolve_resume(c, plan);
  fill_sections(c, plan);
  return resolved;
}

}  // namespace

Plan make_plan(const config::TrainConfig& config, bool model_from_caller) {
  return resolve(config, model_from_caller).plan;
}

config::TrainConfig resolve_config(const config::TrainConfig& config) { return resolve(config, false).config; }

std::string describe(const Plan& plan) {
  const ModelSetup& m = plan.model;
  const data::DataSpec& d = plan.data;
  const RunLength& length = plan.length;
  const OptimizerOptions& optimizer = plan.optimization.optimizer;
  const int64_t replica_count = plan.strategy_options.replicas;
  const bool replicas = plan.strategy.drives_several_devices();
  const int64_t devices = plan.launch.world_size * (replicas ? replica_count : 1);
  std::ostringstream out;
  const bool tokens = models::is_language_model(m.name);
  std::string shape;
  for (const auto& [flag, value] : {std::pair<const char*, int64_t>{"layers", m.gpt_layers},
                                    {"width", m.gpt_width},
                                    {"heads", m.gpt_heads},
                                    {"vocabulary", m.vocab_size}}) {
    if (value > 0) shape += (shape.empty() ? " " : ", ") + std::string(flag) + " " + std::to_string(value);
  }
  const std::string& param_dtype = plan.precision_flags.fsdp_param_dtype;
  out << "model " << m.name << shape << (m.activation_checkpointing ? " (activation checkpointing)" : "")
      << (plan.channels_last ? " channels-last" : "") << "\n"
      << "data " << d.name << (d.path.empty() ? "" : " from " + d.path)
      << (d.image_size > 0 ? " resized to " + std::to_string(d.image_size) : "")
      << (d.seq_len > 0 ? ", " + std::to_string(d.seq_len) + " tokens a sample" : "")
      << (plan.data_options.augment && !tokens ? ", augmented" : "")
      << (data::is_token_dataset(d.name) ? "" : ", normalised " + data::describe_normalization(plan.normalization))
      << "\n"
      << "precision " << plan.precision.name
      << (plan.strategy.takes_fsdp_options() && !param_dtype.empty() &&
                  precision::dtype_named(param_dtype) != torch::kFloat
              ? " (fsdp param_dtype " + param_dtype + ")"
              : "")
      << (plan.precision.master_weights ? " with fp32 master weights" : "")
      << (plan.precision.loss_scaling ? ", loss scaling " + plan.precision_flags.loss_scale : "")
      << loss_scale_rules(plan.precision) << "\n"
      << "device " << plan.device.str()
      << (plan.device.is_cpu() ? " (" + std::to_string(plan.device_setup.threads) + " threads)" : "")
      << (replicas && plan.device.is_cuda() && replica_count > 1
              ? " to cuda:" + std::to_string(plan.device.index() + replica_count - 1)
              : "")
      << ", strategy " << plan.strategy.name() << ", LibTorch "
      << compat::torch_version() << "\n"
      << "batch " << length.batch_size << " per device x " << length.grad_accum << " accumulation x "
      << devices << (plan.launch.world_size > 1 ? " processes" : replicas ? " replicas" : " device")
      << " = global batch " << length.batch_size * length.grad_accum * devices << " per optimizer step\n"
      << "optimizer " << optimizer_name(optimizer.kind) << " lr " << optimizer.lr << " ("
      << schedule_name(plan.optimization.schedule.kind) << ")"
      << ", weight decay " << optimizer.weight_decay
      << (plan.optimization.clip_grad_norm > 0 ? ", clip norm " + std::to_string(plan.optimization.clip_grad_norm) : "")
      << "\n"
      << (length.max_steps > 0 ? std::to_string(length.max_steps) + " steps (--max-steps: the epochs they take)"
                               : "epochs " + std::to_string(length.epochs))
      << ", seed " << plan.cadence.seed;
  if (!plan.resume_path.empty()) out << "\nresume from " << plan.resume_path;
  return out.str();
}

}  // namespace ptrain::train
