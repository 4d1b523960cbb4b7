// zero_optimization: stage 0 is ddp, stages 1-3 zero1-3; offload, bucket sizes and overlap land on the
// flags that act under the stage's strategy, or are named in a warning.
#include <map>
#include <set>

#include "ptrain/config/deepspeed_sections.h"
#include "ptrain/core/error.h"
#include "ptrain/strategy_spec/strategy_spec.h"

namespace ptrain::config::deepspeed {

namespace {

// zero_optimization keys that tune memory and speed only; the trained parameters do not depend on them.
const std::set<std::string> kZeroNoEffectKeys = {
    "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold", "stage3_model_persistence_threshold",
    "stage3_max_live_parameters", "stage3_max_reuse_distance", "prefetch_bucket_size",
    "param_persistence_threshold", "model_persistence_threshold", "max_live_parameters", "max_reuse_distance",
    "sub_group_size", "round_robin_gradients", "allgather_partitions", "reduce_scatter", "elastic_checkpoint",
    "ignore_unused_parameters", "load_from_fp32_weights", "memory_efficient_linear",
    "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
    "gather_16bit_weights_on_model_save", "use_multi_rank_bucket_allreduce", "legacy_stage1",
    "log_trace_cache_warnings", "stage3_use_all_reduce_for_fetch_params", "zeropp_loco_param"};

// DeepSpeed counts bucket sizes in elements of the gradients' dtype (the model's: half with fp16 or
// bf16); ptrain's bucket flags are in MiB.
double bucket_mib(const Reading& r, const json& value, const std::string& key) {
  const double elements = r.keys.non_negative(value, key);
  check(elements > 0, r.keys.where(key) + " must be positive");
  const double bytes_per_element = precision::half_parameters(r.final_mode()) ? 2.0 : 4.0;
  return elements * bytes_per_element / (1024.0 * 1024.0);
}

void read_offload(Reading& r, const json& block, const std::string& key, int64_t stage) {
  const KeyReader& k = r.keys;
  const json& o = k.object(block, key);
  std::string device = "none";
  for (const auto& [name, value] : o.items()) {
    const std::string full = key + "." + name;
    if (name == "device") {
      check(value.is_string(), k.where(full) + " must be cpu, none or nvme");
      device = value.get<std::string>();
      check(device == "cpu" || device == "none",
            k.where(full) + ": '" + device + "' is not supported (cpu or none; NVMe offload is not)");
    } else if (name == "ratio") {
      check(is_auto(value) || k.number(value, full) == 1.0,
            k.where(full) + ": partial offload is not supported (ptrain offloads all optimizer state)");
    } else if (name == "pin_memory" || name == "buffer_count" || name == "buffer_size" || name == "max_in_cpu" ||
               name == "fast_init" || name == "pipeline_read" || name == "pipeline_write" || name == "pipeline" ||
               name == "nvme_path") {
      k.warn(full, "tunes the transfers only");
    } else {
      throw Error(k.where(full) + " is not an offload setting ptrain knows");
    }
  }
  if (device != "cpu") return;
  const bool params = key == "zero_optimization.offload_param";
  check(stage >= (params ? 3 : 1),
        k.where(key) + ": offloading " + (params ? "parameters needs stage 3" : "optimizer state needs stage 1 or more") +
            ", the file asks for stage " + std::to_string(stage));
  (params ? r.overlay.offload_params : r.overlay.offload_optimizer) = FromFile<bool>{true, key + ".device"};
}

int64_t read_stage(Reading& r, const json& zero) {
  const KeyReader& k = r.keys;
  int64_t stage = 0;
  if (zero.contains("stage") && !is_auto(zero.at("stage"))) {
    stage = k.integer(zero.at("stage"), "zero_optimization.stage");
    check(stage >= 0 && stage <= 3,
          k.where("zero_optimization.stage") + " must be 0, 1, 2 or 3, not " + std::to_string(stage));
  }
  if (!zero.contains("stage") || !is_auto(zero.at("stage")))
    r.overlay.strategy = {strategies::StrategySpec::from_zero_stage(stage, k.where("zero_optimization.stage")).name(),
                          "zero_optimization.stage", zero.contains("stage")};
  return stage;
}

}  // namespace

void read_zero_optimization(Reading& r, const json& zero) {
  const KeyReader& k = r.keys;
  ConfigOverlay& o = r.overlay;
  const int64_t stage = read_stage(r, zero);
  for (const auto& [key, value] : zero.items()) {
    const std::string full = "zero_optimization." + key;
    if (key == "stage") continue;
    if (key == "offload_optimizer" || key == "offload_param") {
      read_offload(r, value, full, stage);
    } else if (key == "cpu_offload") {  // the older spelling of offload_optimizer.device cpu
      if (k.boolean(value, full)) {
        check(stage >= 1, k.where(full) + ": offloading optimizer state needs stage 1 or more");
        o.offload_optimizer = {true, full};
      }
    } else if (is_auto(value)) {  // ptrain's value, said in one line
      if (key == "reduce_bucket_size") {
        o.auto_keys.push_back({full, stage == 0 ? "bucket-cap-mb" : stage <= 2 ? "reduce-bucket-mb" : "",
                               "nothing: ptrain's zero3 reduces the gradients of one unit at a time"});
      } else if (key == "overlap_comm") {
        o.auto_keys.push_back({full, "overlap-comm", ""});
      } else if (key == "contiguous_gradients") {
        o.auto_keys.push_back({full, "", "true: ptrain copies gradients into one flat buffer a group"});
      } else if (key == "allgather_bucket_size" || kZeroNoEffectKeys.count(key) > 0) {
        o.auto_keys.push_back({full, "", "nothing: it tunes memory or speed only"});
      } else {
        throw Error(k.where(full) + " is \"auto\", and ptrain has no setting to take it from");
      }
    } else if (key == "reduce_bucket_size") {
      // Stage 0 is ddp, whose buckets --bucket-cap-mb sizes; stage 3 reduces a unit at a time.
      const double mib = bucket_mib(r, value, full);
      if (stage == 0) {
        o.bucket_cap_mb = {mib, full};
      } else if (stage <= 2) {
        o.reduce_bucket_mb = {mib, full};
      } else {
        k.warn(full, "sizes gradient buckets, and ptrain's zero3 reduces the gradients of one unit at a time");
      }
    } else if (key == "allgather_bucket_size") {
      bucket_mib(r, value, full);  // still checked
      k.warn(full, "sizes the all-gather of updated parameters, which ptrain runs one --reduce-bucket-mb group "
                   "at a time");
    } else if (key == "overlap_comm") {
      o.overlap_comm = {k.boolean(value, full), full};
    } else if (key == "contiguous_gradients") {
      if (!k.boolean(value, full))
        k.warn(full, "false would keep gradients apart, and ptrain always copies them into one flat buffer a group");
    } else if (key == "zero_quantized_weights" || key == "zero_quantized_gradients" ||
               key == "zero_quantized_nontrainable_weights" || key == "mics_hierarchical_params_gather") {
      check(!k.boolean(value, full), k.where(full) + ": ZeRO++ quantized communication and MiCS are not supported");
    } else if (key == "zero_hpz_partition_size") {
      check(k.integer(value, full) <= 1,
            k.where(full) + ": ZeRO++ secondary partitions are not supported (fsdp's hybrid-shard comes closest)");
    } else if (key == "mics_shard_size") {
      check(k.integer(value, full) <= 0, k.where(full) + ": MiCS is not supported");
    } else if (kZeroNoEffectKeys.count(key) > 0) {
      k.warn(full, "tunes memory or speed only");
    } else {
      throw Error(k.where(full) + " is not a zero_optimization setting ptrain knows");
    }
  }
}

void read_communication_dtype(Reading& r, const json& value, const std::string& key) {
  if (value.is_null() || is_auto(value)) return;
  const KeyReader& k = r.keys;
  check(value.is_string(), k.where(key) + " must be a dtype name");
  static const std::map<std::string, std::string> names = {
      {"fp32", "fp32"}, {"float32", "fp32"}, {"fp16", "fp16"}, {"float16", "fp16"}, {"bf16", "bf16"},
      {"bfloat16", "bf16"}};
  const auto it = names.find(value.get<std::string>());
  check(it != names.end(), k.where(key) + ": '" + value.get<std::string>() + "' (supported: fp32, fp16, bf16)");
  r.overlay.reduce_dtype = {it->second, key};
}

}  // namespace ptrain::config::deepspeed
