// accelerate's launch config (the YAML `accelerate config` writes), read unchanged by `ptrain launch
// --config`. It becomes launcher options plus the environment through which the started `ptrain train`
// processes learn the strategy, precision and device (PTRAIN_STRATEGY, PTRAIN_PRECISION, PTRAIN_DEVICE;
// their flags still win).
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
  int main_process_port = 29500;
  std::map<std::string, std::string> environment;  // set for every started process
  std::vector<std::string> warnings;               // keys read but without effect in ptrain, named
};

// Unknown keys, values ptrain cannot honour (FSDP, DeepSpeed, TPU, ...) and inconsistent counts throw
// ptrain::Error naming the file and the key.
AccelerateLaunch read_accelerate_config(const std::string& path);

}  // namespace ptrain::config
