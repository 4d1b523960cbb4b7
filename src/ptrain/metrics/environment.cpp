#include "ptrain/metrics/environment.h"

#include <dlfcn.h>

#include <utility>

#include "ptrain/core/torch_compat.h"
#include "ptrain/metrics/memory.h"
#include "ptrain/metrics/nvml.h"

namespace ptrain::metrics {

namespace {

// The libraries' own C entry points, looked up among what the process loaded: the same call for every
// LibTorch release (none of these are LibTorch API), and a CPU build simply finds none.
template <typename Function>
Function loaded_function(const char* name) {
  return reinterpret_cast<Function>(::dlsym(RTLD_DEFAULT, name));
}

// cudaRuntimeGetVersion and ncclGetVersion: int(int*), 0 for success.
std::optional<int> version_from(const char* name) {
  const auto get = loaded_function<int (*)(int*)>(name);
  int version = 0;
  if (get == nullptr || get(&version) != 0) return std::nullopt;
  return version;
}

}  // namespace

std::optional<std::string> loaded_cuda_runtime_version() {
  const auto v = version_from("cudaRuntimeGetVersion");  // 13000 for 13.0
  if (!v) return std::nullopt;
  return std::to_string(*v / 1000) + "." + std::to_string(*v % 1000 / 10);
}

std::optional<std::string> loaded_cudnn_version() {
  const auto get = loaded_function<size_t (*)()>("cudnnGetVersion");
  if (get == nullptr) return std::nullopt;
  return std::to_string(get());  // as torch.backends.cudnn.version() gives it: 91900 for 9.19.0
}

std::optional<std::string> loaded_nccl_version() {
  const auto v = version_from("ncclGetVersion");
  if (!v) return std::nullopt;
  // NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9, major*1000 + minor*100 + patch before.
  const int major = *v >= 20900 ? *v / 10000 : *v / 1000;
  const int minor = *v >= 20900 ? *v % 10000 / 100 : *v % 1000 / 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(*v % 100);
}

int nvml_index_for_cuda_device(int cuda_index) {
  auto& nvml = Nvml::instance();
  if (!nvml.available()) return -1;
  return nvml.index_for_pci_bus_id(cuda_device_pci_bus_id(cuda_index)).value_or(-1);
}

nlohmann::json describe_environment(const torch::Device& device) {
  nlohmann::json env = {
      {"torch_version", compat::torch_version()}, {"device", device.str()}, {"ptrain_commit", source_commit()}};
  auto& nvml = Nvml::instance();
  if (device.is_cuda() && nvml.available()) {
    const int index = nvml_index_for_cuda_device(device.index());
    if (index >= 0) env["gpu_name"] = nvml.device_name(index).value_or("");
    env["driver_version"] = nvml.driver_version().value_or("");
  }
  if (device.is_cuda()) env["gpu_count"] = static_cast<int64_t>(torch::cuda::device_count());
  for (const auto& [key, version] : {std::pair{"cuda_version", loaded_cuda_runtime_version()},
                                     std::pair{"cudnn_version", loaded_cudnn_version()},
                                     std::pair{"nccl_version", loaded_nccl_version()}}) {
    if (version) env[key] = *version;
  }
  return env;
}

}  // namespace ptrain::metrics
