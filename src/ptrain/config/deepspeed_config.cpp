// The top level of a ds_config.json: batch keys, clipping and the keys without effect are read here;
// each section goes to its reader (deepspeed_sections.h).
#include "ptrain/config/deepspeed_config.h"

#include <set>

#include "ptrain/config/cli_options.h"
#include "ptrain/config/deepspeed_sections.h"
#include "ptrain/core/error.h"

namespace ptrain::config {

namespace {

using deepspeed::is_auto;
using deepspeed::json;

// Top-level keys that configure logging, profiling or monitoring only: they cannot change the result.
const std::set<std::string> kNoEffectKeys = {
    "steps_per_print", "wall_clock_breakdown", "dump_state", "memory_breakdown", "flops_profiler",
    "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger", "timers", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "checkpoint", "aio"};

bool is_batch_key(const std::string& key) {
  return key == "train_batch_size" || key == "train_micro_batch_size_per_gpu" || key == "gradient_accumulation_steps";
}

void read_batch_key(const deepspeed::KeyReader& k, const std::string& key, const json& value, ConfigOverlay& overlay) {
  BatchKeysOfFile& batch = overlay.batch;
  batch.any = true;
  BatchKey& target = key == "train_batch_size"                 ? batch.train_batch
                     : key == "train_micro_batch_size_per_gpu" ? batch.micro_batch
                                                               : batch.accumulation;
  if (is_auto(value)) {
    if (&target == &batch.micro_batch) batch.micro_auto = true;
    if (&target == &batch.accumulation) batch.accumulation_auto = true;
    overlay.auto_keys.push_back({key, &target == &batch.micro_batch     ? "batch-size"
                                      : &target == &batch.accumulation ? "grad-accum"
                                                                       : "global-batch-size", ""});
  } else {
    target.value = k.positive_integer(value, key);
  }
}

// Keys whose effect ptrain has no way to give, or none at all: refused or named in a warning.
void read_key_without_equivalent(const deepspeed::KeyReader& k, const std::string& key, const json& value) {
  if (key == "prescale_gradients" || key == "gradient_predivide_factor") {
    const bool default_value = key == "prescale_gradients" ? value == json(false) : value == json(1.0);
    if (!default_value)
      k.warn(key, "changes only where gradients are divided by the world size (rounding); ptrain divides once");
  } else if (key == "sparse_gradients" || key == "amp") {
    const bool enabled = key == "amp" ? k.object(value, key).value("enabled", false) : value == json(true);
    check(!enabled, k.where(key) + ": " + (key == "amp" ? "NVIDIA apex AMP is not supported (use fp16, bf16 or "
                                                          "torch_autocast)"
                                                        : "sparse gradients are not supported"));
  } else if (key == "activation_checkpointing") {
    k.warn(key, "configures DeepSpeed's checkpointing API that model code calls; use --activation-checkpointing");
  } else if (kNoEffectKeys.count(key) > 0) {
    k.warn(key, "configures logging, monitoring or checkpoint I/O only");
  } else {
    throw Error(k.where(key) + " is not a DeepSpeed setting ptrain knows (supported: zero_optimization, fp16, bf16, "
                               "torch_autocast, train_batch_size, train_micro_batch_size_per_gpu, "
                               "gradient_accumulation_steps, gradient_clipping, optimizer, scheduler, "
                               "communication_data_type, and logging keys)");
  }
}

}  // namespace

ConfigOverlay read_deepspeed_config(const std::string& path, const TrainConfig& before, const FlagsGiven& given) {
  const json root = deepspeed::load_object(path);
  ConfigOverlay overlay;
  overlay.source = path;
  deepspeed::Reading r{deepspeed::KeyReader(path, overlay.warnings), before, given, overlay};
  const deepspeed::KeyReader& k = r.keys;

  // The sections are read once the whole top level is: the precision decides how the others read.
  deepspeed::PrecisionBlocks precision;
  json zero, optimizer, scheduler;
  for (const auto& [key, value] : root.items()) {
    if (is_batch_key(key)) {
      read_batch_key(k, key, value, overlay);
    } else if (key == "gradient_clipping") {
      if (is_auto(value)) {
        overlay.auto_keys.push_back({key, "clip-grad-norm", ""});
      } else {
        overlay.clip_grad_norm = {k.non_negative(value, key), key};
      }
    } else if (key == "fp16") {
      precision.fp16 = k.object(value, key);
    } else if (key == "bf16" || key == "bfloat16") {
      precision.bf16 = k.object(value, key);
      precision.bf16_key = key;
    } else if (key == "torch_autocast") {
      precision.autocast = k.object(value, key);
    } else if (key == "zero_optimization") {
      zero = k.object(value, key);
    } else if (key == "optimizer") {
      optimizer = k.object(value, key);
    } else if (key == "scheduler") {
      scheduler = k.object(value, key);
    } else if (key == "communication_data_type") {
      deepspeed::read_communication_dtype(r, value, key);
    } else {
      read_key_without_equivalent(k, key, value);
    }
  }
  deepspeed::read_precision(r, precision);
  if (!zero.is_null()) deepspeed::read_zero_optimization(r, zero);
  if (!optimizer.is_null()) deepspeed::read_optimizer(r, optimizer);
  if (!scheduler.is_null()) deepspeed::read_scheduler(r, scheduler);
  return overlay;
}

std::vector<std::string> apply_deepspeed_config(const CLI::App& app, TrainConfig& config, const std::string& path,
                                                int64_t world_size) {
  const FlagsGiven given = flags_given(app);
  return apply_overlay(read_deepspeed_config(path, config, given), config, given, world_size);
}

}  // namespace ptrain::config
