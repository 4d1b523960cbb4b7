#include "ptrain/config/accelerate_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "ptrain/config/cli_options.h"
#include "ptrain/config/number_checks.h"
#include "ptrain/core/error.h"
#include "ptrain/precision/policy.h"
#include "ptrain/strategy_spec/strategy_spec.h"

namespace ptrain::config {

namespace {

std::string text_of(const YAML::Node& node) { return node.IsScalar() ? node.as<std::string>() : std::string(); }

// Decimal, as every integer ptrain reads (yaml-cpp's as<int> reads 010 as octal eight).
int integer_of(const YAML::Node& node, const std::string& where) {
  check(node.IsScalar(), where + " must be an integer");
  const int64_t value = decimal_integer(text_of(node), where);
  check(value >= std::numeric_limits<int>::min() && value <= std::numeric_limits<int>::max(),
        where + ": '" + text_of(node) + "' is out of range");
  return static_cast<int>(value);
}

bool boolean_of(const YAML::Node& node, const std::string& where) {
  try {
    return node.as<bool>();
  } catch (const YAML::Exception&) {
    throw Error(where + " must be true or false, not '" + text_of(node) + "'");
  }
}

// yaml-cpp keeps both entries of a key given twice, and the readers below would apply both in turn: refused, as
// ptrain's own YAML configs refuse it, naming both lines. prefix: the keys of the mappings around map.
void check_keys_given_once(const YAML::Node& map, const std::string& path, const std::string& prefix = "") {
  std::map<std::string, int> lines;
  for (const auto& entry : map) {
    const std::string key = entry.first.as<std::string>();
    const int line = entry.first.Mark().line + 1;
    const auto [first, inserted] = lines.emplace(key, line);
    check(inserted, path + ": key '" + prefix + key + "' is given twice (lines " + std::to_string(first->second) +
                        " and " + std::to_string(line) + "): keep one");
    if (entry.second.IsMap()) check_keys_given_once(entry.second, path, prefix + key + ".");
  }
}

// Sets the `ptrain train` option `flag` for every started process (through its PTRAIN_* variable).
void set_option(AccelerateLaunch& launch, const std::string& flag, const std::string& value) {
  launch.environment[env_name_of(flag)] = value;
}

std::string choice(const YAML::Node& value, const std::string& where,
                   const std::vector<std::pair<std::string, std::string>>& names) {
  const std::string text = text_of(value);
  std::string known;
  for (const auto& [name, mapped] : names) {
    if (name == text) return mapped;
    known += (known.empty() ? "" : ", ") + name;
  }
  throw Error(where + ": '" + text + "' is not one of " + known);
}

// accelerate's fp8_config (what `accelerate config` writes for mixed_precision: fp8). Its backend names the recipe:
// Transformer Engine's is delayed scaling (ptrain's --fp8-scaling delayed), torchao's Float8Linear dynamic
// (tensorwise) scaling, ptrain's default; MS-AMP's FP8 optimizer states are not ptrain's. Settings ptrain does not
// follow are said in a warning, naming what it does instead.
void read_fp8_config(const YAML::Node& fp8, const std::string& path, AccelerateLaunch& launch) {
  for (const auto& entry : fp8) {
    const std::string key = entry.first.as<std::string>();
    const YAML::Node& value = entry.second;
    const std::string where = path + ": key 'fp8_config." + key + "'";
    const auto no_effect = [&](const std::string& what_ptrain_does) {
      launch.warnings.push_back(where + " is " + text_of(value) + ": ptrain " + what_ptrain_does);
    };
    if (key == "backend") {
      const std::string backend = choice(value, where, {{"TE", "delayed"}, {"AO", "dynamic"}, {"MSAMP", "msamp"}});
      check(backend != "msamp", where + ": MS-AMP's recipe (FP8 weights and optimizer states, opt_level O1/O2) is not "
                                        "ptrain's; backend TE or AO trains linear layers in FP8 as ptrain does");
      set_option(launch, "fp8-scaling", backend);
    } else if (key == "amax_history_len") {
      if (integer_of(value, where) != 16) no_effect("keeps the amax of the last 16 casts (--fp8-scaling delayed)");
    } else if (key == "amax_compute_algo") {
      if (text_of(value) != "max") no_effect("scales by the largest amax of the history (max)");
    } else if (key == "fp8_format") {
      if (text_of(value) != "HYBRID") no_effect("casts activations and weights to E4M3, gradients to E5M2 (HYBRID)");
    } else if (key == "margin") {
      if (integer_of(value, where) != 0) no_effect("scales each amax to the format's largest value (margin 0)");
    } else if (key == "interval") {
      if (integer_of(value, where) != 1) no_effect("computes each scale at every cast (interval 1)");
    } else if (key == "override_linear_precision") {
      // A tuple of three booleans: written (false, false, false) or as a list.
      std::string text = value.IsSequence() ? "" : text_of(value);
      if (value.IsSequence()) {
        for (const auto& b : value) text += text_of(b);
      }
      if (text.find("true") != std::string::npos || text.find("True") != std::string::npos)
        no_effect("runs all three products of each FP8 linear layer in FP8");
    } else if (key == "use_autocast_during_eval") {
      if (!boolean_of(value, where)) no_effect("evaluates with the same FP8 products it trains with");
    } else if (key == "opt_level" || key == "enable_fsdp_float8_all_gather" || key == "pad_inner_dim") {
      launch.warnings.push_back(where + " has no effect: ptrain " +
                                (key == "opt_level" ? std::string("keeps fp32 master weights and optimizer states")
                                 : key == "pad_inner_dim"
                                     ? std::string("keeps in bf16 the layers whose features are not multiples of 16")
                                     : std::string("gathers sharded parameters in their own dtype")));
    } else {
      throw Error(where + " is not an fp8_config setting ptrain knows");
    }
  }
}

// ipex_config (accelerate 0.2x to 1.12 write it for every CPU setup): whether accelerate hands the model and
// optimizer to Intel Extension for PyTorch. ipex: true is a speed-up, not another job (the same model, loss and
// updates), and accelerate itself trains without IPEX wherever it is not installed; ptrain has no IPEX, so it
// runs the job as accelerate would there, saying so in a warning rather than refusing.
void read_ipex_config(const YAML::Node& ipex, const std::string& path, AccelerateLaunch& launch) {
  for (const auto& entry : ipex) {
    const std::string key = entry.first.as<std::string>();
    const std::string where = path + ": key 'ipex_config." + key + "'";
    check(key == "ipex", where + " is not an ipex_config setting ptrain knows (ipex)");
    if (boolean_of(entry.second, where))
      launch.warnings.push_back(where + " is true: ptrain does not use Intel Extension for PyTorch (IPEX); it trains "
                                        "as accelerate does where IPEX is not installed");
  }
}

// mpirun_config (accelerate's MULTI_CPU launch through mpirun). mpirun_hostfile spreads the processes over the
// hosts it lists, which ptrain launch (it starts processes on this machine only) cannot do: taking the file
// anyway would start every process here, or wait for machines nobody started, so a hostfile is an error naming
// what to run instead. mpirun_ccl is oneCCL's worker thread count (CCL_WORKER_COUNT), a speed setting of the ccl
// backend; ptrain's CPU collectives are gloo's, so no value changes its job, and accelerate's default (1) is
// not worth a warning.
void read_mpirun_config(const YAML::Node& mpirun, const std::string& path, AccelerateLaunch& launch) {
  for (const auto& entry : mpirun) {
    const std::string key = entry.first.as<std::string>();
    const YAML::Node& value = entry.second;
    const std::string where = path + ": key 'mpirun_config." + key + "'";
    if (key == "mpirun_hostfile") {
      const std::string hostfile = value.IsNull() ? "" : text_of(value);
      check(hostfile.empty(),
            where + " is '" + hostfile + "': ptrain launch does not start processes through mpirun or on other hosts; "
                    "run ptrain launch on every machine (num_machines, machine_rank, main_process_ip) or set "
                    "mpirun_hostfile to null");
    } else if (key == "mpirun_ccl") {
      check(value.IsScalar() || value.IsNull(), where + " must be a number of threads");
      if (!value.IsNull() && text_of(value) != "1")
        launch.warnings.push_back(where + " is " + text_of(value) + " (oneCCL worker threads) and has no effect: "
                                          "ptrain's CPU collectives are gloo's, not oneCCL's");
    } else {
      throw Error(where + " is not an mpirun_config setting ptrain knows (mpirun_hostfile, mpirun_ccl)");
    }
  }
}

// fsdp_config: PyTorch FSDP's settings as accelerate names them (both spellings accelerate has used).
void read_fsdp_config(const YAML::Node& fsdp, const std::string& path, AccelerateLaunch& launch) {
  std::string backward_prefetch, backward_prefetch_key;
  std::string sharding, sharding_key;
  for (const auto& entry : fsdp) {
    const std::string key = entry.first.as<std::string>();
    const YAML::Node& value = entry.second;
    const std::string where = path + ": key 'fsdp_config." + key + "'";
    const auto flag = [&](const char* name) { set_option(launch, name, boolean_of(value, where) ? "true" : "false"); };
    if (key == "fsdp_auto_wrap_policy") {
      set_option(launch, "auto-wrap",
                 choice(value, where, {{"SIZE_BASED_WRAP", "size"}, {"TRANSFORMER_BASED_WRAP", "type"}, {"NO_WRAP", "none"}}));
    } else if (key == "fsdp_transformer_layer_cls_to_wrap") {
      std::string types;
      if (value.IsSequence()) {
        for (const auto& item : value) types += (types.empty() ? "" : ",") + text_of(item);
      } else {
        types = text_of(value);
      }
      types.erase(std::remove(types.begin(), types.end(), ' '), types.end());
      set_option(launch, "wrap-types", types);
    } else if (key == "fsdp_min_num_params") {
      const int min_num_params = integer_of(value, where);
      check(min_num_params >= 0, where + " must not be negative");
      if (min_num_params > 0) {
        set_option(launch, "min-num-params", std::to_string(min_num_params));
      } else {
        launch.warnings.push_back(where + " is 0: ptrain keeps its own --min-num-params");
      }
    } else if (key == "fsdp_backward_prefetch" || key == "fsdp_backward_prefetch_policy") {
      const std::string mapped =
          choice(value, where, {{"BACKWARD_PRE", "pre"}, {"BACKWARD_POST", "post"}, {"NO_PREFETCH", "none"}});
      check(backward_prefetch.empty() || backward_prefetch == mapped,
            path + ": fsdp_config." + backward_prefetch_key + " and fsdp_config." + key + " disagree");
      backward_prefetch = mapped;
      backward_prefetch_key = key;
    } else if (key == "fsdp_forward_prefetch") {
      flag("forward-prefetch");
    } else if (key == "fsdp_offload_params") {
      flag("offload-params");
    } else if (key == "fsdp_sharding_strategy" || key == "fsdp_reshard_after_forward") {
      std::string mapped;
      if (key == "fsdp_reshard_after_forward" && (text_of(value) == "true" || text_of(value) == "false")) {
        mapped = boolean_of(value, where) ? "full-shard" : "shard-grad-op";  // FSDP2's spelling
      } else {
        mapped = choice(value, where,
                        {{"FULL_SHARD", "full-shard"}, {"1", "full-shard"}, {"SHARD_GRAD_OP", "shard-grad-op"},
                         {"2", "shard-grad-op"}, {"NO_SHARD", "no-shard"}, {"3", "no-shard"},
                         {"HYBRID_SHARD", "hybrid-shard"}, {"4", "hybrid-shard"},
                         {"_HYBRID_SHARD_ZERO2", "hybrid-shard-zero2"}, {"5", "hybrid-shard-zero2"}});
      }
      check(sharding.empty() || sharding == mapped,
            path + ": fsdp_config." + sharding_key + " and fsdp_config." + key + " disagree");
      sharding = mapped;
      sharding_key = key;
    } else if (key == "fsdp_state_dict_type") {
      const std::string mapped = choice(value, where,
                                        {{"FULL_STATE_DICT", "full"}, {"SHARDED_STATE_DICT", "sharded"},
                                         {"LOCAL_STATE_DICT", "-"}});
      check(mapped != "-", where + ": LOCAL_STATE_DICT is not supported (FULL_STATE_DICT or SHARDED_STATE_DICT)");
      set_option(launch, "state-dict", mapped);
    } else if (key == "fsdp_sync_module_states") {
      flag("sync-module-states");
    } else if (key == "fsdp_activation_checkpointing") {
      flag("activation-checkpointing");
    } else if (key == "fsdp_use_orig_params") {
      launch.warnings.push_back(where + " has no effect: ptrain's parameters keep their identity under fsdp");
    } else if (key == "fsdp_cpu_ram_efficient_loading") {
      if (boolean_of(value, where))
        launch.warnings.push_back(where + " has no effect: every rank builds the model, and --sync-module-states "
                                          "broadcasts rank 0's");
    } else if (key == "fsdp_version") {
      const int version = integer_of(value, where);
      check(version == 1 || version == 2, where + " must be 1 or 2");
    } else {
      throw Error(where + " is not an FSDP setting ptrain knows");
    }
  }
  if (!backward_prefetch.empty()) set_option(launch, "backward-prefetch", backward_prefetch);
  if (!sharding.empty()) set_option(launch, "fsdp-sharding", sharding);
}

// deepspeed_config: accelerate's short form of a ds_config.json, or the path of one.
void read_deepspeed_section(const YAML::Node& ds, const std::string& path, AccelerateLaunch& launch,
                            bool& has_config_file) {
  int stage = 2;  // accelerate's default
  std::string offload_optimizer = "none", offload_param = "none";
  for (const auto& entry : ds) {
    const std::string key = entry.first.as<std::string>();
    const YAML::Node& value = entry.second;
    const std::string where = path + ": key 'deepspeed_config." + key + "'";
    if (key == "zero_stage") {
      stage = integer_of(value, where);
      check(stage >= 0 && stage <= 3, where + " must be 0, 1, 2 or 3");
    } else if (key == "offload_optimizer_device" || key == "offload_param_device") {
      const std::string device = text_of(value);
      check(device == "none" || device == "cpu", where + ": '" + device + "' is not supported (none or cpu)");
      (key == "offload_optimizer_device" ? offload_optimizer : offload_param) = device;
    } else if (key == "offload_optimizer_nvme_path" || key == "offload_param_nvme_path") {
      launch.warnings.push_back(where + " has no effect: ptrain does not offload to NVMe");
    } else if (key == "gradient_accumulation_steps") {
      const int steps = integer_of(value, where);
      check(steps > 0, where + " must be positive");
      set_option(launch, "grad-accum", std::to_string(steps));
    } else if (key == "gradient_clipping") {
      double norm = 0;
      try {
        norm = value.as<double>();
      } catch (const YAML::Exception&) {
        throw Error(where + " must be a number, not '" + text_of(value) + "'");
      }
      check(norm >= 0, where + " must not be negative");
      set_option(launch, "clip-grad-norm", text_of(value));
    } else if (key == "zero3_init_flag" || key == "zero3_save_16bit_model") {
      if (boolean_of(value, where))
        launch.warnings.push_back(where + (key == "zero3_init_flag"
                                               ? " has no effect: ptrain builds the model, then shards it"
                                               : " has no effect: checkpoints follow --state-dict"));
    } else if (key == "deepspeed_config_file") {
      set_option(launch, "deepspeed-config", text_of(value));
      has_config_file = true;
    } else if (key == "deepspeed_multinode_launcher" || key == "deepspeed_hostfile" ||
               key == "deepspeed_exclusion_filter" || key == "deepspeed_inclusion_filter") {
      launch.warnings.push_back(where + " has no effect: run ptrain launch on every node");
    } else {
      throw Error(where + " is not a DeepSpeed setting ptrain knows");
    }
  }
  if (has_config_file) {
    check(!ds["zero_stage"] && !ds["offload_optimizer_device"] && !ds["offload_param_device"] &&
              !ds["gradient_accumulation_steps"] && !ds["gradient_clipping"],
          path + ": deepspeed_config.deepspeed_config_file and the keys it replaces (zero_stage, offload_*_device, "
                 "gradient_accumulation_steps, gradient_clipping) are given together; keep them in the file");
    return;
  }
  set_option(launch, "strategy", strategies::StrategySpec::from_zero_stage(stage, path + ": key 'deepspeed_config.zero_stage'").name());
  if (offload_optimizer == "cpu") {
    check(stage >= 1, path + ": deepspeed_config.offload_optimizer_device cpu needs zero_stage 1 or more");
    set_option(launch, "offload-optimizer", "true");
  }
  if (offload_param == "cpu") {
    check(stage == 3, path + ": deepspeed_config.offload_param_device cpu needs zero_stage 3");
    set_option(launch, "offload-params", "true");
  }
}

}  // namespace

AccelerateLaunch read_accelerate_config(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw Error(path + ": cannot open the accelerate config");
  } catch (const YAML::Exception& e) {
    throw Error(path + ": not valid YAML: " + e.what());
  }
  check(root.IsMap(), path + ": an accelerate config is a mapping of keys to values");
  check_keys_given_once(root, path);

  AccelerateLaunch launch;
  std::string distributed_type = "NO";
  int num_processes = 1;
  bool use_cpu = false;
  std::string mixed_precision = "no";
  std::optional<c10::ScalarType> half;  // mixed_precision's dtype; none: "no" or fp8
  bool fp8 = false;                     // mixed_precision: fp8
  YAML::Node fsdp_config, deepspeed_config, fp8_config, mpirun_config;
  for (const auto& entry : root) {
    const std::string key = entry.first.as<std::string>();
    const YAML::Node& value = entry.second;
    const std::string where = path + ": key '" + key + "'";
    if (key == "compute_environment") {
      check(text_of(value) == "LOCAL_MACHINE", where + ": only LOCAL_MACHINE is supported, not '" + text_of(value) + "'");
    } else if (key == "distributed_type") {
      distributed_type = text_of(value);
      check(distributed_type == "NO" || distributed_type == "MULTI_GPU" || distributed_type == "MULTI_CPU" ||
                distributed_type == "FSDP" || distributed_type == "DEEPSPEED",
            where + ": '" + distributed_type + "' is not supported (supported: NO, MULTI_GPU, MULTI_CPU, FSDP, DEEPSPEED)");
    } else if (key == "fp8_config") {
      check(value.IsMap() || value.IsNull(), where + " must be a mapping");
      fp8_config = value;
    } else if (key == "fsdp_config" || key == "deepspeed_config") {
      check(value.IsMap() || value.IsNull(), where + " must be a mapping");
      (key == "fsdp_config" ? fsdp_config : deepspeed_config) = value;
    } else if (key == "mixed_precision") {
      // accelerate's vocabulary: the 16-bit float each value trains in.
      static const std::map<std::string, std::optional<c10::ScalarType>> kMixedPrecision{
          {"no", std::nullopt}, {"fp16", c10::ScalarType::Half}, {"bf16", c10::ScalarType::BFloat16}};
      mixed_precision = text_of(value);
      const auto it = kMixedPrecision.find(mixed_precision);
      // accelerate's "fp8" is spelled as ptrain's mode.
      fp8 = precision::precision_mode_or_none(mixed_precision) == precision::PrecisionMode::FP8;
      check(it != kMixedPrecision.end() || fp8, where + ": '" + mixed_precision + "' is not supported (no, fp16, bf16, fp8)");
      if (it != kMixedPrecision.end()) half = it->second;
    } else if (key == "num_processes") {
      num_processes = integer_of(value, where);
      check(num_processes > 0, where + " must be positive");
    } else if (key == "num_machines") {
      launch.num_machines = integer_of(value, where);
      check(launch.num_machines > 0, where + " must be positive");
    } else if (key == "machine_rank") {
      launch.machine_rank = integer_of(value, where);
    } else if (key == "main_process_ip") {
      launch.main_process_ip = text_of(value);
    } else if (key == "main_process_port") {
      launch.main_process_port = integer_of(value, where);
    } else if (key == "use_cpu") {
      use_cpu = boolean_of(value, where);
    } else if (key == "gpu_ids") {
      const std::string ids = value.IsSequence() ? "" : text_of(value);
      if (value.IsSequence()) {
        std::string joined;
        for (const auto& id : value) joined += (joined.empty() ? "" : ",") + text_of(id);
        launch.environment["CUDA_VISIBLE_DEVICES"] = joined;
      } else if (ids != "all" && !ids.empty()) {
        launch.environment["CUDA_VISIBLE_DEVICES"] = ids;
      }
    } else if (key == "downcast_bf16") {
      check(text_of(value) == "no" || text_of(value) == "false",
            where + ": downcasting fp32 to bf16 is a TPU setting ptrain does not support");
    } else if (key == "rdzv_backend") {
      check(text_of(value) == "static", where + ": only the static rendezvous is supported, not '" + text_of(value) + "'");
    } else if (key == "tpu_env" || key == "tpu_use_cluster" || key == "tpu_use_sudo") {
      const bool unused = value.IsSequence() ? value.size() == 0 : !boolean_of(value, where);
      check(unused, where + ": TPUs are not supported");
    } else if (key == "debug" || key == "enable_cpu_affinity") {
      if (boolean_of(value, where))
        launch.warnings.push_back(where + " has no effect: " +
                                  (key == "debug" ? "ptrain's collectives report errors on every rank anyway"
                                                  : "ptrain does not pin processes to CPUs"));
    } else if (key == "main_training_function" || key == "same_network") {
      // accelerate writes both into every file. main_training_function names the function its TPU launcher
      // calls (TPUs are refused above); same_network picks torchrun's static master address over a c10d
      // rendezvous endpoint at the same main_process_ip:main_process_port, which ptrain's static rendezvous
      // reaches either way. Neither changes a ptrain job, whatever its value, so neither is worth a warning.
    } else if (key == "ipex_config") {
      check(value.IsMap() || value.IsNull(), where + " must be a mapping");
      read_ipex_config(value, path, launch);
    } else if (key == "mpirun_config") {
      check(value.IsMap() || value.IsNull(), where + " must be a mapping");
      mpirun_config = value;
    } else {
      throw Error(where + " is not an accelerate setting ptrain knows");
    }
  }
  check(num_processes % launch.num_machines == 0,
        path + ": num_processes " + std::to_string(num_processes) + " is not divisible by num_machines " +
            std::to_string(launch.num_machines));
  check(launch.machine_rank >= 0 && launch.machine_rank < launch.num_machines,
        path + ": machine_rank " + std::to_string(launch.machine_rank) + " is outside 0.." +
            std::to_string(launch.num_machines - 1));
  launch.num_processes_per_machine = num_processes / launch.num_machines;
  if (mpirun_config && mpirun_config.IsMap()) read_mpirun_config(mpirun_config, path, launch);

  const bool distributed = distributed_type != "NO";
  check(distributed || num_processes == 1, path + ": distributed_type NO with num_processes " +
                                               std::to_string(num_processes) + " (use MULTI_GPU or MULTI_CPU)");
  const auto filled = [](const YAML::Node& node) { return node && node.IsMap() && node.size() > 0; };
  check(!filled(fsdp_config) || distributed_type == "FSDP",
        path + ": key 'fsdp_config' is given, but distributed_type is " + distributed_type + ", not FSDP");
  check(!filled(deepspeed_config) || distributed_type == "DEEPSPEED",
        path + ": key 'deepspeed_config' is given, but distributed_type is " + distributed_type + ", not DEEPSPEED");
  bool has_deepspeed_file = false;
  if (distributed_type == "FSDP") {
    set_option(launch, "strategy", strategies::StrategySpec(strategies::StrategyKind::fsdp).name());
    if (filled(fsdp_config)) read_fsdp_config(fsdp_config, path, launch);
  } else if (distributed_type == "DEEPSPEED") {
    read_deepspeed_section(filled(deepspeed_config) ? deepspeed_config : YAML::Node(YAML::NodeType::Map), path, launch,
                           has_deepspeed_file);
  } else if (distributed) {
    set_option(launch, "strategy", strategies::StrategySpec(strategies::StrategyKind::ddp).name());
  }
  if (use_cpu || distributed_type == "MULTI_CPU") set_option(launch, "device", "cpu");
  if (fp8) {
    // accelerate's FP8 (torchao's Float8Linear, or Transformer Engine) is ptrain's --precision fp8: linear layers'
    // matrix products in FP8, amp-bf16 around them. Under DeepSpeed, accelerate hands FP8 to Transformer Engine,
    // whose recipe ptrain does not follow.
    check(distributed_type != "DEEPSPEED",
          path + ": key 'mixed_precision': fp8 under DEEPSPEED is Transformer Engine's recipe, which ptrain does not "
                 "have; use --precision fp8 with --strategy zero1/zero2/zero3");
    set_option(launch, "precision", precision::to_string(precision::PrecisionMode::FP8));
    if (filled(fp8_config)) read_fp8_config(fp8_config, path, launch);
  } else if (filled(fp8_config)) {
    launch.warnings.push_back(path + ": key 'fp8_config' has no effect: mixed_precision is " + mixed_precision +
                              ", not fp8");
  }
  if (half) {
    if (distributed_type == "DEEPSPEED") {
      // DeepSpeed keeps the model in half precision and fp32 master weights in the optimizer; with a
      // ds_config file, its fp16/bf16 blocks decide.
      if (has_deepspeed_file) {
        launch.warnings.push_back(path + ": key 'mixed_precision' is decided by deepspeed_config_file's fp16/bf16 blocks");
      } else {
        set_option(launch, "precision", precision::to_string(precision::half_mode(*half, /*autocast=*/false)));
        set_option(launch, "master-weights", "true");
      }
    } else {
      set_option(launch, "precision", precision::to_string(precision::half_mode(*half, /*autocast=*/true)));
      if (distributed_type == "FSDP") {
        // accelerate's FSDP mixed precision: parameters, gradient reduction and buffers in that dtype.
        for (const char* flag : {"param-dtype", "reduce-dtype", "buffer-dtype"}) set_option(launch, flag, precision::dtype_name(*half));
      }
    }
  }
  return launch;
}

}  // namespace ptrain::config
