// accelerate's launch config (the YAML `accelerate config` writes), read unchanged by `ptrain launch
// --config`. It becomes launcher options plus the environment through which the started `ptrain train`
// processes learn their settings: each is the PTRAIN_* variable of a train flag (PTRAIN_STRATEGY,
// PTRAIN_PRECISION, PTRAIN_FSDP_SHARDING, PTRAIN_DEEPSPEED_CONFIG, ...; see env_name_of), and flags
// still win. distributed_type NO, MULTI_GPU, MULTI_CPU (with ipex_config and mpirun_config), FSDP (fsdp_config)
// and DEEPSPEED (deepspeed_config, or its deepspeed_config_file) are read.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace ptrain::config {

struct AccelerateLaunch {
  int num_processes_per_machine = 1;
  int num_machines = 1;
  int machine_rank = 0;
  std::string main_process_ip = "127.0.0.1";
  int main_process_port = 0;  // 0: not in the file (ptrain launch picks, as for --master-port)
  std::map<std::string, std::string> environment;  // set for every started process
  std::vector<std::string> warnings;               // keys read but without effect in ptrain, named
};

// Unknown keys, values ptrain cannot honour (TPU, NVMe offload, ...) and inconsistent counts throw
// ptrain::Error naming the file and the key.
AccelerateLaunch read_accelerate_config(const std::string& path);

}  // namespace ptrain::config
