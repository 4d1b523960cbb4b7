#include "ptrain/config/deepspeed_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include "ptrain/core/error.h"
#include "ptrain/precision/policy.h"
#include "ptrain/strategies/strategy_spec.h"

namespace ptrain::config {

namespace {

using json = nlohmann::json;

// The shortest text that reads back as the same double (3e-4 stays "0.0003").
std::string number_text(double value) {
  char text[40];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  return text;
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return text;
}

bool is_auto(const json& value) { return value.is_string() && value.get<std::string>() == "auto"; }

// Top-level keys that configure logging, profiling or monitoring only: they cannot change the result.
const std::set<std::string> kNoEffectKeys = {
    "steps_per_print", "wall_clock_breakdown", "dump_state", "memory_breakdown", "flops_profiler",
    "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger", "timers", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "checkpoint", "aio"};

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

class DeepSpeedReader {
 public:
  DeepSpeedReader(CLI::App& app, TrainConfig& config, std::string path, int64_t world_size)
      : app_(app), config_(config), path_(std::move(path)), world_size_(world_size) {
    for (const CLI::Option* opt : app_.get_options()) {
      if (opt->count() > 0 && !opt->get_lnames().empty()) given_.insert(opt->get_lnames().front());
    }
  }

  std::vector<std::string> run() {
    std::ifstream in(path_);
    check(in.good(), path_ + ": cannot open the DeepSpeed config");
    json root;
    try {
      root = json::parse(in);
    } catch (const json::parse_error& e) {
      throw Error(path_ + ": not valid JSON: " + e.what());
    }
    check(root.is_object(), path_ + ": a DeepSpeed config is a JSON object of keys to values");

    json fp16, bf16, autocast, zero, optimizer, scheduler;
    BatchKey train_batch{std::nullopt, "train_batch_size"};
    BatchKey micro_batch{std::nullopt, "train_micro_batch_size_per_gpu"};
    BatchKey accumulation{std::nullopt, "gradient_accumulation_steps"};
    bool micro_auto = false, accumulation_auto = false, any_batch_key = false;

    for (const auto& [key, value] : root.items()) {
      if (key == "train_batch_size" || key == "train_micro_batch_size_per_gpu" ||
          key == "gradient_accumulation_steps") {
        any_batch_key = true;
        BatchKey& target =
            key == "train_batch_size" ? train_batch : key == "train_micro_batch_size_per_gpu" ? micro_batch : accumulation;
        if (is_auto(value)) {
          if (&target == &micro_batch) micro_auto = true;
          if (&target == &accumulation) accumulation_auto = true;
        } else {
          target.value = positive_integer(value, key);
        }
      } else if (key == "gradient_clipping") {
        if (!is_auto(value)) set("clip-grad-norm", number_text(non_negative(value, key)), key);
      } else if (key == "fp16") {
        fp16 = object(value, key);
      } else if (key == "bf16" || key == "bfloat16") {
        bf16 = object(value, key);
        bf16_key_ = key;
      } else if (key == "torch_autocast") {
        autocast = object(value, key);
      } else if (key == "zero_optimization") {
        zero = object(value, key);
      } else if (key == "optimizer") {
        optimizer = object(value, key);
      } else if (key == "scheduler") {
        scheduler = object(value, key);
      } else if (key == "communication_data_type") {
        communication_dtype(value, key);
      } else if (key == "prescale_gradients" || key == "gradient_predivide_factor") {
        const bool default_value = key == "prescale_gradients" ? value == json(false) : value == json(1.0);
        if (!default_value)
          warn(key, "changes only where gradients are divided by the world size (rounding); ptrain divides once");
      } else if (key == "sparse_gradients" || key == "amp") {
        const bool enabled = key == "amp" ? object(value, key).value("enabled", false) : value == json(true);
        check(!enabled, where(key) + ": " + (key == "amp" ? "NVIDIA apex AMP is not supported (use fp16, bf16 or "
                                                           "torch_autocast)"
                                                         : "sparse gradients are not supported"));
      } else if (key == "activation_checkpointing") {
        warn(key, "configures DeepSpeed's checkpointing API that model code calls; use --activation-checkpointing");
      } else if (kNoEffectKeys.count(key) > 0) {
        warn(key, "configures logging, monitoring or checkpoint I/O only");
      } else {
        throw Error(where(key) + " is not a DeepSpeed setting ptrain knows (supported: zero_optimization, fp16, bf16, "
                                 "torch_autocast, train_batch_size, train_micro_batch_size_per_gpu, "
                                 "gradient_accumulation_steps, gradient_clipping, optimizer, scheduler, "
                                 "communication_data_type, and logging keys)");
      }
    }

    precision(fp16, bf16, autocast);
    if (!zero.is_null()) zero_optimization(zero);
    if (!optimizer.is_null()) optimizer_block(optimizer);
    if (!scheduler.is_null()) scheduler_block(scheduler);
    apply_settings();
    if (cos_min_ratio_ && given_.count("min-lr") == 0) config_.optim.min_lr = config_.optim.lr * *cos_min_ratio_;

    if (any_batch_key) {
      // Flags and --config keys win; "auto" takes ptrain's value.
      if (given_.count("batch-size") > 0 || micro_auto) {
        overridden_batch(micro_batch, "batch-size", config_.run.batch_size, micro_auto);
      }
      if (given_.count("grad-accum") > 0 || accumulation_auto) {
        overridden_batch(accumulation, "grad-accum", config_.optim.grad_accum, accumulation_auto);
      }
      if (given_.count("global-batch-size") > 0 && config_.run.global_batch_size > 0) {
        overridden_batch(train_batch, "global-batch-size", config_.run.global_batch_size, false);
      }
      if (!micro_batch.value && !train_batch.value) {
        micro_batch = {config_.run.batch_size, "--batch-size"};  // ptrain's own micro batch
      }
      try {
        const BatchSizes sizes = resolve_batch_sizes(train_batch, micro_batch, accumulation, world_size_);
        config_.run.batch_size = sizes.micro_batch;
        config_.optim.grad_accum = sizes.accumulation;
        config_.run.global_batch_size = 0;  // resolved here: batch_size and grad_accum say it all
      } catch (const Error& e) {
        throw Error(path_ + ": " + e.what());
      }
    }
    return warnings_;
  }

 private:
  std::string where(const std::string& key) const { return path_ + ": key '" + key + "'"; }

  void warn(const std::string& key, const std::string& why) {
    warnings_.push_back(where(key) + " has no equivalent in ptrain and is not applied: it " + why);
  }

  json object(const json& value, const std::string& key) const {
    check(value.is_object(), where(key) + " must be an object");
    return value;
  }

  double number(const json& value, const std::string& key) const {
    check(value.is_number(), where(key) + " must be a number, not " + value.dump());
    return value.get<double>();
  }

  double non_negative(const json& value, const std::string& key) const {
    const double n = number(value, key);
    check(n >= 0.0 && std::isfinite(n), where(key) + " must be a non-negative number, not " + value.dump());
    return n;
  }

  int64_t integer(const json& value, const std::string& key) const {
    const double n = number(value, key);
    check(std::floor(n) == n && std::abs(n) < 9e18, where(key) + " must be a whole number, not " + value.dump());
    return static_cast<int64_t>(n);
  }

  int64_t positive_integer(const json& value, const std::string& key) const {
    const int64_t n = integer(value, key);
    check(n > 0, where(key) + " must be positive, not " + value.dump());
    return n;
  }

  bool boolean(const json& value, const std::string& key) const {
    check(value.is_boolean(), where(key) + " must be true or false, not " + value.dump());
    return value.get<bool>();
  }

  // A flag the file sets; applied after the whole file is read (a later key of the file replaces an
  // earlier one: the scheduler's peak rate replaces the optimizer's lr, as in DeepSpeed). explicit_key:
  // the file names the value (else it is DeepSpeed's default for a key the file left out).
  void set(const std::string& flag, const std::string& value, const std::string& key, bool explicit_key = true) {
    settings_[flag] = Setting{value, key, explicit_key};
    if (std::find(order_.begin(), order_.end(), flag) == order_.end()) order_.push_back(flag);
  }

  void apply_settings() {
    for (const auto& flag : order_) {
      const Setting& s = settings_.at(flag);
      CLI::Option* opt = app_.get_option_no_throw("--" + flag);
      check(opt != nullptr, "DeepSpeed config: internal: no flag --" + flag);
      if (given_.count(flag) > 0) {
        const auto& results = opt->results();
        const std::string current = results.empty() ? "" : results.back();
        if (s.explicit_key && current != s.value) {
          warnings_.push_back(where(s.key) + " (" + s.value + ") is overridden by --" + flag + " " + current +
                              " from the command line, PTRAIN_* or --config");
        }
        continue;
      }
      try {
        opt->add_result(s.value);
        opt->run_callback();
      } catch (const CLI::Error& e) {
        throw Error(where(s.key) + ": " + e.what());
      }
    }
  }

  // The final precision mode: the one given on the command line (or --config), else the file's.
  std::string final_precision() const {
    if (given_.count("precision") > 0) return config_.precision.precision;
    const auto it = settings_.find("precision");
    return it != settings_.end() ? it->second.value : config_.precision.precision;
  }
  precision::PrecisionMode final_mode() const { return precision::mode_named(final_precision()); }

  // A block's "enabled"; "auto" is whatever ptrain is asked to run: does that mode train in this block's
  // half dtype (fp16, bf16), or autocast (torch_autocast)?
  bool enabled(const json& block, const std::string& key,
               const std::function<bool(precision::PrecisionMode)>& auto_means) const {
    if (block.is_null() || !block.contains("enabled")) return false;
    const json& value = block.at("enabled");
    if (is_auto(value)) return auto_means(precision::mode_named(config_.precision.precision));
    return boolean(value, key + ".enabled");
  }

  void precision(const json& fp16, const json& bf16, const json& autocast) {
    const auto trains_in = [](c10::ScalarType half) {
      return [half](precision::PrecisionMode mode) { return precision::half_dtype(mode) == half; };
    };
    const bool fp16_on = enabled(fp16, "fp16", trains_in(c10::ScalarType::Half));
    const bool bf16_on = enabled(bf16, bf16_key_, trains_in(c10::ScalarType::BFloat16));
    const bool autocast_on = enabled(autocast, "torch_autocast", precision::autocasts);
    check(!(fp16_on && bf16_on), path_ + ": fp16 and " + bf16_key_ + " are both enabled; enable one");
    check(!(autocast_on && (fp16_on || bf16_on)),
          path_ + ": torch_autocast together with fp16 or bf16 is not supported; enable one");

    if (!bf16.is_null()) {
      for (const auto& [key, value] : bf16.items()) {
        const std::string full = bf16_key_ + "." + key;
        if (key == "enabled") continue;
        if (key == "immediate_grad_update" || key == "check_grad_overflow") {
          warn(full, "tunes DeepSpeed's bf16 optimizer wrapper only");
        } else if (key == "bf16_master_weights_and_grads" || key == "bf16_optimizer_states") {
          check(!boolean(value, full), where(full) + ": ptrain keeps fp32 master weights and optimizer state");
        } else {
          throw Error(where(full) + " is not a bf16 setting ptrain knows");
        }
      }
      if (bf16_on && is_explicit_true(bf16)) set_half_precision(c10::ScalarType::BFloat16, bf16_key_ + ".enabled");
    }
    if (!autocast.is_null()) {
      std::string dtype = "bfloat16";
      for (const auto& [key, value] : autocast.items()) {
        const std::string full = "torch_autocast." + key;
        if (key == "enabled") continue;
        if (key == "dtype") {
          check(value.is_string(), where(full) + " must be a dtype name");
          dtype = value.get<std::string>();
          if (dtype.rfind("torch.", 0) == 0) dtype = dtype.substr(6);
          check(dtype == "bfloat16" || dtype == "float16",
                where(full) + ": '" + value.get<std::string>() + "' (supported: bfloat16, float16)");
        } else {
          throw Error(where(full) + " is not a torch_autocast setting ptrain supports (autocast follows "
                                    "torch.autocast's own op lists)");
        }
      }
      if (autocast_on && is_explicit_true(autocast))
        set("precision",
            precision::to_string(precision::half_mode(
                dtype == "bfloat16" ? c10::ScalarType::BFloat16 : c10::ScalarType::Half, /*autocast=*/true)),
            "torch_autocast.enabled");
    }
    if (!fp16.is_null()) fp16_block(fp16, fp16_on);
  }

  static bool is_explicit_true(const json& block) { return block.at("enabled") == json(true); }

  // DeepSpeed's fp16/bf16: the model in half precision, fp32 master weights in the optimizer. A
  // --precision given elsewhere wins, and master weights only go with the pure half modes.
  void set_half_precision(c10::ScalarType half, const std::string& key) {
    set("precision", precision::to_string(precision::half_mode(half, /*autocast=*/false)), key);
    if (precision::half_parameters(final_mode())) set("master-weights", "true", key);
  }

  void fp16_block(const json& fp16, bool on) {
    if (on && is_explicit_true(fp16)) set_half_precision(c10::ScalarType::Half, "fp16.enabled");
    // DeepSpeed's defaults for the keys the file leaves out.
    double loss_scale = 0;
    int64_t initial_scale_power = 16, window = 1000, hysteresis = 2;
    double min_loss_scale = 1;
    bool consecutive = false;
    std::vector<std::string> dynamic_keys;
    for (const auto& [key, value] : fp16.items()) {
      const std::string full = "fp16." + key;
      if (key == "enabled") continue;
      if (is_auto(value)) continue;  // ptrain's value (DeepSpeed's default where ptrain has none)
      if (key == "loss_scale") {
        loss_scale = non_negative(value, full);
      } else if (key == "initial_scale_power") {
        initial_scale_power = integer(value, full);
        check(initial_scale_power >= 0 && initial_scale_power <= 127, where(full) + " must be in 0..127");
        dynamic_keys.push_back(full);
      } else if (key == "loss_scale_window") {
        window = positive_integer(value, full);
        dynamic_keys.push_back(full);
      } else if (key == "hysteresis") {
        hysteresis = positive_integer(value, full);
        dynamic_keys.push_back(full);
      } else if (key == "consecutive_hysteresis") {
        consecutive = boolean(value, full);
        dynamic_keys.push_back(full);
      } else if (key == "min_loss_scale") {
        min_loss_scale = non_negative(value, full);
        dynamic_keys.push_back(full);
      } else if (key == "auto_cast") {
        warn(full, "is not needed: ptrain feeds the model its inputs in the compute dtype");
      } else if (key == "fp16_master_weights_and_grads") {
        check(!boolean(value, full), where(full) + ": ptrain keeps fp32 master weights and gradients");
      } else {
        throw Error(where(full) + " is not an fp16 setting ptrain knows (enabled, loss_scale, initial_scale_power, "
                                  "loss_scale_window, hysteresis, consecutive_hysteresis, min_loss_scale)");
      }
    }
    const std::string mode = final_precision();
    const bool uses_fp16 = on && precision::half_dtype(final_mode()) == c10::ScalarType::Half;
    if (!uses_fp16) {
      if (!dynamic_keys.empty() || loss_scale > 0)
        warnings_.push_back(path_ + ": the fp16 loss-scaling keys have no effect: precision is " + mode);
      return;
    }
    if (loss_scale > 0) {
      set("loss-scale", number_text(loss_scale), "fp16.loss_scale");
      for (const auto& key : dynamic_keys) warn(key, "applies to dynamic loss scaling, and loss_scale sets a static one");
      return;
    }
    const bool explicit_dynamic = fp16.contains("loss_scale") && !is_auto(fp16.at("loss_scale"));
    set("loss-scale", "dynamic", "fp16.loss_scale", explicit_dynamic);
    const auto has = [&](const char* key) { return fp16.contains(key) && !is_auto(fp16.at(key)); };
    set("initial-loss-scale", number_text(std::ldexp(1.0, static_cast<int>(initial_scale_power))),
        "fp16.initial_scale_power", has("initial_scale_power"));
    set("loss-scale-window", std::to_string(window), "fp16.loss_scale_window", has("loss_scale_window"));
    set("hysteresis", std::to_string(hysteresis), "fp16.hysteresis", has("hysteresis"));
    set("consecutive-hysteresis", consecutive ? "true" : "false", "fp16.consecutive_hysteresis",
        has("consecutive_hysteresis"));
    set("min-loss-scale", number_text(min_loss_scale), "fp16.min_loss_scale", has("min_loss_scale"));
  }

  void communication_dtype(const json& value, const std::string& key) {
    if (value.is_null() || is_auto(value)) return;
    check(value.is_string(), where(key) + " must be a dtype name");
    static const std::map<std::string, std::string> names = {
        {"fp32", "fp32"}, {"float32", "fp32"}, {"fp16", "fp16"}, {"float16", "fp16"}, {"bf16", "bf16"},
        {"bfloat16", "bf16"}};
    const auto it = names.find(value.get<std::string>());
    check(it != names.end(), where(key) + ": '" + value.get<std::string>() + "' (supported: fp32, fp16, bf16)");
    set("reduce-dtype", it->second, key);
  }

  // DeepSpeed counts bucket sizes in elements of the gradients' dtype (the model's: half with fp16 or
  // bf16); ptrain's bucket flags are in MiB.
  double bucket_mib(const json& value, const std::string& key) const {
    const double elements = non_negative(value, key);
    check(elements > 0, where(key) + " must be positive");
    const double bytes_per_element = precision::half_parameters(final_mode()) ? 2.0 : 4.0;
    return elements * bytes_per_element / (1024.0 * 1024.0);
  }

  void offload(const json& block, const std::string& key, int64_t stage) {
    const json& o = object(block, key);
    std::string device = "none";
    for (const auto& [name, value] : o.items()) {
      const std::string full = key + "." + name;
      if (name == "device") {
        check(value.is_string(), where(full) + " must be cpu, none or nvme");
        device = value.get<std::string>();
        check(device == "cpu" || device == "none",
              where(full) + ": '" + device + "' is not supported (cpu or none; NVMe offload is not)");
      } else if (name == "ratio") {
        check(is_auto(value) || number(value, full) == 1.0,
              where(full) + ": partial offload is not supported (ptrain offloads all optimizer state)");
      } else if (name == "pin_memory" || name == "buffer_count" || name == "buffer_size" || name == "max_in_cpu" ||
                 name == "fast_init" || name == "pipeline_read" || name == "pipeline_write" || name == "pipeline" ||
                 name == "nvme_path") {
        warn(full, "tunes the transfers only");
      } else {
        throw Error(where(full) + " is not an offload setting ptrain knows");
      }
    }
    if (device != "cpu") return;
    const bool params = key == "zero_optimization.offload_param";
    check(stage >= (params ? 3 : 1),
          where(key) + ": offloading " + (params ? "parameters needs stage 3" : "optimizer state needs stage 1 or more") +
              ", the file asks for stage " + std::to_string(stage));
    set(params ? "offload-params" : "offload-optimizer", "true", key + ".device");
  }

  void zero_optimization(const json& zero) {
    int64_t stage = 0;
    if (zero.contains("stage") && !is_auto(zero.at("stage"))) {
      stage = integer(zero.at("stage"), "zero_optimization.stage");
      check(stage >= 0 && stage <= 3, where("zero_optimization.stage") + " must be 0, 1, 2 or 3, not " +
                                          std::to_string(stage));
    }
    if (!zero.contains("stage") || !is_auto(zero.at("stage")))
      set("strategy", strategies::StrategySpec::from_zero_stage(stage, where("zero_optimization.stage")).name(),
          "zero_optimization.stage", zero.contains("stage"));
    for (const auto& [key, value] : zero.items()) {
      const std::string full = "zero_optimization." + key;
      if (key == "stage") continue;
      if (key == "offload_optimizer" || key == "offload_param") {
        offload(value, full, stage);
      } else if (key == "cpu_offload") {  // the older spelling of offload_optimizer.device cpu
        if (boolean(value, full)) {
          check(stage >= 1, where(full) + ": offloading optimizer state needs stage 1 or more");
          set("offload-optimizer", "true", full);
        }
      } else if (is_auto(value)) {
        continue;  // ptrain's value
      } else if (key == "reduce_bucket_size") {
        // Stage 0 is ddp, whose buckets --bucket-cap-mb sizes; stage 3 reduces a unit at a time.
        const std::string mib = number_text(bucket_mib(value, full));
        if (stage == 0) {
          set("bucket-cap-mb", mib, full);
        } else if (stage <= 2) {
          set("reduce-bucket-mb", mib, full);
        } else {
          warn(full, "sizes gradient buckets, and ptrain's zero3 reduces the gradients of one unit at a time");
        }
      } else if (key == "allgather_bucket_size") {
        bucket_mib(value, full);  // still checked
        warn(full, "sizes the all-gather of updated parameters, which ptrain runs one --reduce-bucket-mb group "
                   "at a time");
      } else if (key == "overlap_comm") {
        set("overlap-comm", boolean(value, full) ? "true" : "false", full);
      } else if (key == "contiguous_gradients") {
        if (!boolean(value, full))
          warn(full, "false would keep gradients apart, and ptrain always copies them into one flat buffer a group");
      } else if (key == "zero_quantized_weights" || key == "zero_quantized_gradients" ||
                 key == "zero_quantized_nontrainable_weights" || key == "mics_hierarchical_params_gather") {
        check(!boolean(value, full), where(full) + ": ZeRO++ quantized communication and MiCS are not supported");
      } else if (key == "zero_hpz_partition_size") {
        check(integer(value, full) <= 1,
              where(full) + ": ZeRO++ secondary partitions are not supported (fsdp's hybrid-shard comes closest)");
      } else if (key == "mics_shard_size") {
        check(integer(value, full) <= 0, where(full) + ": MiCS is not supported");
      } else if (kZeroNoEffectKeys.count(key) > 0) {
        warn(full, "tunes memory or speed only");
      } else {
        throw Error(where(full) + " is not a zero_optimization setting ptrain knows");
      }
    }
  }

  void optimizer_block(const json& block) {
    std::string type;
    json params = json::object();
    for (const auto& [key, value] : block.items()) {
      if (key == "type") {
        check(value.is_string(), where("optimizer.type") + " must be a name");
        type = value.get<std::string>();
      } else if (key == "params") {
        params = object(value, "optimizer.params");
      } else {
        throw Error(where("optimizer." + key) + " is not an optimizer setting (type, params)");
      }
    }
    const std::string name = lower(type);
    check(name == "sgd" || name == "adam" || name == "adamw",
          where("optimizer.type") + ": '" + type + "' has no ptrain equivalent (supported: SGD, Adam, AdamW)");
    const bool sgd = name == "sgd";
    set("optimizer", sgd ? "sgd" : "adamw", "optimizer.type");
    bool torch_adam = false, adam_w_mode = true;
    for (const auto& [key, value] : params.items()) {
      const std::string full = "optimizer.params." + key;
      if (is_auto(value)) continue;  // ptrain's value
      if (key == "lr") {
        set("lr", number_text(non_negative(value, full)), full);
      } else if (key == "weight_decay") {
        set("weight-decay", number_text(non_negative(value, full)), full);
      } else if (!sgd && key == "betas") {
        check(value.is_array() && value.size() == 2, where(full) + " must be a list of two numbers");
        set("beta1", number_text(number(value[0], full)), full);
        set("beta2", number_text(number(value[1], full)), full);
      } else if (!sgd && key == "eps") {
        set("eps", number_text(non_negative(value, full)), full);
      } else if (!sgd && key == "adam_w_mode") {
        adam_w_mode = boolean(value, full);
      } else if (!sgd && key == "torch_adam") {
        torch_adam = boolean(value, full);
      } else if (!sgd && (key == "bias_correction")) {
        check(boolean(value, full), where(full) + ": Adam without bias correction is not supported");
      } else if (!sgd && key == "amsgrad") {
        check(!boolean(value, full), where(full) + ": AMSGrad is not supported");
      } else if (sgd && key == "momentum") {
        set("momentum", number_text(non_negative(value, full)), full);
      } else if (sgd && key == "nesterov") {
        set("nesterov", boolean(value, full) ? "true" : "false", full);
      } else if (sgd && key == "dampening") {
        check(number(value, full) == 0.0, where(full) + ": SGD dampening is not supported");
      } else {
        throw Error(where(full) + " is not a " + type + " parameter ptrain knows");
      }
    }
    // DeepSpeed's Adam is AdamW unless adam_w_mode is false (the type AdamW always is).
    check(name == "adamw" || sgd || adam_w_mode,
          where("optimizer.params.adam_w_mode") + ": Adam with L2 regularisation (adam_w_mode false) is not supported; "
                                                  "ptrain's adamw decouples weight decay");
    // The defaults of the optimizer DeepSpeed builds, for the parameters the file leaves out.
    const auto missing = [&](const char* key) { return !params.contains(key); };
    if (sgd) {
      check(!missing("lr"), where("optimizer.params.lr") + " is required for SGD");
      if (missing("momentum")) set("momentum", "0", "optimizer.params.momentum", false);
      if (missing("weight_decay")) set("weight-decay", "0", "optimizer.params.weight_decay", false);
      if (missing("nesterov")) set("nesterov", "false", "optimizer.params.nesterov", false);
    } else {
      if (missing("lr")) set("lr", "0.001", "optimizer.params.lr", false);
      if (missing("betas")) {
        set("beta1", "0.9", "optimizer.params.betas", false);
        set("beta2", "0.999", "optimizer.params.betas", false);
      }
      if (missing("eps")) set("eps", "1e-08", "optimizer.params.eps", false);
      // FusedAdam and DeepSpeedCPUAdam default to no weight decay; torch.optim.AdamW to 0.01.
      if (missing("weight_decay"))
        set("weight-decay", torch_adam ? "0.01" : "0", "optimizer.params.weight_decay", false);
    }
  }

  void scheduler_block(const json& block) {
    std::string type;
    json params = json::object();
    for (const auto& [key, value] : block.items()) {
      if (key == "type") {
        check(value.is_string(), where("scheduler.type") + " must be a name");
        type = value.get<std::string>();
      } else if (key == "params") {
        params = object(value, "scheduler.params");
      } else {
        throw Error(where("scheduler." + key) + " is not a scheduler setting (type, params)");
      }
    }
    check(type == "WarmupLR" || type == "WarmupCosineLR",
          where("scheduler.type") + ": '" + type + "' has no ptrain equivalent (supported: WarmupLR, WarmupCosineLR" +
              (type == "WarmupDecayLR" ? "; ptrain has no linear decay: use WarmupCosineLR or --schedule cosine" : "") +
              ")");
    const bool cosine = type == "WarmupCosineLR";
    const auto value_of = [&](const char* key) -> const json* {
      return params.contains(key) && !is_auto(params.at(key)) ? &params.at(key) : nullptr;
    };
    for (const auto& [key, value] : params.items()) {
      static const std::set<std::string> warmup_lr = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                                      "warmup_type", "last_batch_iteration"};
      static const std::set<std::string> warmup_cosine = {"total_num_steps", "warmup_min_ratio", "warmup_num_steps",
                                                          "cos_min_ratio", "warmup_type", "last_batch_iteration"};
      check((cosine ? warmup_cosine : warmup_lr).count(key) > 0,
            where("scheduler.params." + key) + " is not a " + type + " parameter ptrain knows");
    }
    std::string warmup_type = "log";  // DeepSpeed's default
    if (const json* v = value_of("warmup_type")) {
      check(v->is_string(), where("scheduler.params.warmup_type") + " must be log or linear");
      warmup_type = v->get<std::string>();
    }
    if (const json* v = value_of("last_batch_iteration"))
      check(integer(*v, "scheduler.params.last_batch_iteration") == -1,
            where("scheduler.params.last_batch_iteration") + ": resuming a schedule this way is not supported "
                                                              "(ptrain resumes from its checkpoints)");
    int64_t warmup_steps = 1000;
    const json* steps = value_of("warmup_num_steps");
    if (steps) warmup_steps = integer(*steps, "scheduler.params.warmup_num_steps");
    check(warmup_steps >= 0, where("scheduler.params.warmup_num_steps") + " must not be negative");
    if (warmup_steps > 0 && (steps || !params.contains("warmup_num_steps"))) {
      check(warmup_type == "linear",
            where("scheduler.params.warmup_type") + ": '" + warmup_type + "'" +
                (params.contains("warmup_type") ? "" : " (DeepSpeed's default)") +
                " is not supported: ptrain warms up linearly; set \"warmup_type\": \"linear\"");
      const char* floor_key = cosine ? "warmup_min_ratio" : "warmup_min_lr";
      if (const json* v = value_of(floor_key))
        check(number(*v, std::string("scheduler.params.") + floor_key) == 0.0,
              where(std::string("scheduler.params.") + floor_key) + ": ptrain's warm-up starts from 0");
      set("warmup-steps", std::to_string(warmup_steps), "scheduler.params.warmup_num_steps", steps != nullptr);
      set("warmup-epochs", "0", "scheduler.params.warmup_num_steps", false);
      warnings_.push_back(where("scheduler.params.warmup_num_steps") +
                          ": ptrain's linear warm-up gives optimizer step s (from 0) the rate lr x (s+1)/" +
                          std::to_string(warmup_steps) + "; DeepSpeed's " + type +
                          " counts from its own first step and can trail it by one step");
    } else if (warmup_steps == 0) {
      set("warmup-steps", "0", "scheduler.params.warmup_num_steps");
      set("warmup-epochs", "0", "scheduler.params.warmup_num_steps", false);
    }
    if (!cosine) {
      set("schedule", "constant", "scheduler.type");
      if (const json* v = value_of("warmup_max_lr"))
        set("lr", number_text(non_negative(*v, "scheduler.params.warmup_max_lr")), "scheduler.params.warmup_max_lr");
      else if (!params.contains("warmup_max_lr"))
        set("lr", "0.001", "scheduler.params.warmup_max_lr", false);
      return;
    }
    set("schedule", "cosine", "scheduler.type");
    cos_min_ratio_ = 0.0001;  // DeepSpeed's default
    if (const json* v = value_of("cos_min_ratio")) cos_min_ratio_ = non_negative(*v, "scheduler.params.cos_min_ratio");
    check(*cos_min_ratio_ <= 1.0, where("scheduler.params.cos_min_ratio") + " must not exceed 1");
    if (const json* v = value_of("total_num_steps")) {
      const int64_t total = positive_integer(*v, "scheduler.params.total_num_steps");
      set("max-steps", std::to_string(total), "scheduler.params.total_num_steps");
      warnings_.push_back(where("scheduler.params.total_num_steps") + " becomes --max-steps " + std::to_string(total) +
                          ": ptrain's cosine spans the run, which ends there or at the last of --epochs, whichever "
                          "comes first");
    } else {
      check(params.contains("total_num_steps"), where("scheduler.params.total_num_steps") + " is required for " + type);
    }
  }

  void overridden_batch(BatchKey& key, const std::string& flag, int64_t value, bool file_said_auto) {
    if (key.value && *key.value != value)
      warnings_.push_back(where(key.source) + " (" + std::to_string(*key.value) + ") is overridden by --" + flag +
                          " " + std::to_string(value));
    key.value = value;
    key.source = file_said_auto && given_.count(flag) == 0 ? key.source + " (\"auto\": --" + flag + ")" : "--" + flag;
  }

  struct Setting {
    std::string value;
    std::string key;
    bool explicit_key;
  };

  CLI::App& app_;
  TrainConfig& config_;
  std::string path_;
  int64_t world_size_;
  std::set<std::string> given_;  // options set before the file: command line, PTRAIN_*, --config
  std::map<std::string, Setting> settings_;
  std::vector<std::string> order_;
  std::vector<std::string> warnings_;
  std::string bf16_key_ = "bf16";
  std::optional<double> cos_min_ratio_;
};

std::string described(const BatchKey& key) { return key.source + " " + std::to_string(*key.value); }

}  // namespace

BatchSizes resolve_batch_sizes(const BatchKey& train_batch, const BatchKey& micro_batch, const BatchKey& accumulation,
                               int64_t world_size) {
  check(world_size > 0, "batch sizes: the world size must be positive");
  for (const BatchKey* key : {&train_batch, &micro_batch, &accumulation}) {
    if (key->value) check(*key->value > 0, key->source + " must be positive, not " + std::to_string(*key->value));
  }
  const std::string world = "world size " + std::to_string(world_size);
  BatchSizes s;
  if (train_batch.value && micro_batch.value && accumulation.value) {
    s = {*micro_batch.value, *accumulation.value, *train_batch.value};
    check(s.train_batch == s.micro_batch * s.accumulation * world_size,
          described(train_batch) + " disagrees with " + described(micro_batch) + " x " + described(accumulation) +
              " x " + world + " = " + std::to_string(s.micro_batch * s.accumulation * world_size) +
              " (train_batch_size must be micro batch x accumulation x world size)");
  } else if (train_batch.value && micro_batch.value) {
    const int64_t per_step = *micro_batch.value * world_size;
    check(*train_batch.value % per_step == 0, described(train_batch) + " is not divisible by " +
                                                  described(micro_batch) + " x " + world);
    s = {*micro_batch.value, *train_batch.value / per_step, *train_batch.value};
  } else if (train_batch.value && accumulation.value) {
    const int64_t per_step = *accumulation.value * world_size;
    check(*train_batch.value % per_step == 0, described(train_batch) + " is not divisible by " +
                                                  described(accumulation) + " x " + world);
    s = {*train_batch.value / per_step, *accumulation.value, *train_batch.value};
  } else if (micro_batch.value && accumulation.value) {
    s = {*micro_batch.value, *accumulation.value, *micro_batch.value * *accumulation.value * world_size};
  } else if (train_batch.value) {
    check(*train_batch.value % world_size == 0, described(train_batch) + " is not divisible by the " + world);
    s = {*train_batch.value / world_size, 1, *train_batch.value};
  } else if (micro_batch.value) {
    s = {*micro_batch.value, 1, *micro_batch.value * world_size};
  } else {
    throw Error("train_batch_size or train_micro_batch_size_per_gpu is needed (" + accumulation.source +
                " alone does not give a batch size)");
  }
  return s;
}

std::vector<std::string> apply_deepspeed_config(CLI::App& app, TrainConfig& config, const std::string& path,
                                                int64_t world_size) {
  return DeepSpeedReader(app, config, path, world_size).run();
}

}  // namespace ptrain::config
