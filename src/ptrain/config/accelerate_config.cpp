#include "ptrain/config/accelerate_config.h"

#include <yaml-cpp/yaml.h>

#include <set>

#include "ptrain/core/error.h"

namespace ptrain::config {

namespace {

std::string text_of(const YAML::Node& node) { return node.IsScalar() ? node.as<std::string>() : std::string(); }

int integer_of(const YAML::Node& node, const std::string& where) {
  try {
    return node.as<int>();
  } catch (const YAML::Exception&) {
    throw Error(where + " must be an integer, not '" + text_of(node) + "'");
  }
}

bool boolean_of(const YAML::Node& node, const std::string& where) {
  try {
    return node.as<bool>();
  } catch (const YAML::Exception&) {
    throw Error(where + " must be true or false, not '" + text_of(node) + "'");
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

  AccelerateLaunch launch;
  std::string distributed_type = "NO";
  int num_processes = 1;
  bool use_cpu = false;
  std::string mixed_precision = "no";
  for (const auto& entry : root) {
    const std::string key = entry.first.as<std::string>();
    const YAML::Node& value = entry.second;
    const std::string where = path + ": key '" + key + "'";
    if (key == "compute_environment") {
      check(text_of(value) == "LOCAL_MACHINE", where + ": only LOCAL_MACHINE is supported, not '" + text_of(value) + "'");
    } else if (key == "distributed_type") {
      distributed_type = text_of(value);
      check(distributed_type == "NO" || distributed_type == "MULTI_GPU" || distributed_type == "MULTI_CPU",
            where + ": '" + distributed_type + "' is not supported (supported: NO, MULTI_GPU, MULTI_CPU)");
    } else if (key == "mixed_precision") {
      mixed_precision = text_of(value);
      check(mixed_precision == "no" || mixed_precision == "fp16" || mixed_precision == "bf16",
            where + ": '" + mixed_precision + "' is not supported (no, fp16, bf16)");
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
    } else if (key == "main_training_function" || key == "same_network") {
      launch.warnings.push_back(path + ": key '" + key + "' has no effect: ptrain runs the command given after --");
    } else {
      throw Error(where + " is not an accelerate setting ptrain knows (FSDP and DeepSpeed settings are not supported yet)");
    }
  }
  check(num_processes % launch.num_machines == 0,
        path + ": num_processes " + std::to_string(num_processes) + " is not divisible by num_machines " +
            std::to_string(launch.num_machines));
  check(launch.machine_rank >= 0 && launch.machine_rank < launch.num_machines,
        path + ": machine_rank " + std::to_string(launch.machine_rank) + " is outside 0.." +
            std::to_string(launch.num_machines - 1));
  launch.num_processes_per_machine = num_processes / launch.num_machines;

  const bool distributed = distributed_type != "NO";
  check(distributed || num_processes == 1, path + ": distributed_type NO with num_processes " +
                                               std::to_string(num_processes) + " (use MULTI_GPU or MULTI_CPU)");
  if (distributed) launch.environment["PTRAIN_STRATEGY"] = "ddp";
  if (use_cpu || distributed_type == "MULTI_CPU") launch.environment["PTRAIN_DEVICE"] = "cpu";
  if (mixed_precision != "no") launch.environment["PTRAIN_PRECISION"] = "amp-" + mixed_precision;
  return launch;
}

}  // namespace ptrain::config
