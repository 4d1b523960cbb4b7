#include "ptrain/metrics/environment.h"

#include "ptrain/core/torch_compat.h"
#include "ptrain/metrics/memory.h"
#include "ptrain/metrics/nvml.h"

namespace ptrain::metrics {

int nvml_index_for_cuda_device(int cuda_index) {
  auto& nvml = Nvml::instance();
  if (!nvml.available()) return -1;
  return nvml.index_for_pci_bus_id(cuda_device_pci_bus_id(cuda_index)).value_or(-1);
}

nlohmann::json describe_environment(const torch::Device& device) {
  nlohmann::json env = {{"torch_version", compat::torch_version()}, {"device", device.str()}};
  auto& nvml = Nvml::instance();
  if (device.is_cuda() && nvml.available()) {
    const int index = nvml_index_for_cuda_device(device.index());
    if (index >= 0) env["gpu_name"] = nvml.device_name(index).value_or("");
    env["driver_version"] = nvml.driver_version().value_or("");
  }
  return env;
}

}  // namespace ptrain::metrics
