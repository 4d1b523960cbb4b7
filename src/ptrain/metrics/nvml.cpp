#include "ptrain/metrics/nvml.h"

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <type_traits>

namespace ptrain::metrics {
namespace {

// The few NVML types used here, declared locally so that no NVML header (part of the CUDA toolkit,
// absent on CPU-only build machines) is needed. Their layouts are fixed by NVML's C ABI, and the
// versioned entry points (_v2) below are the ones whose signatures match these declarations.
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
struct nvmlUtilization_t {
  unsigned int gpu;     // percent of the last sample period in which a kernel ran
  unsigned int memory;  // percent of it in which device memory was read or written
};
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
constexpr unsigned kDeviceNameBufferSize = 96;     // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned kDriverVersionBufferSize = 80;  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE

}  // namespace

struct Nvml::Api {
  nvmlReturn_t (*init)();
  nvmlReturn_t (*shutdown)();
  const char* (*error_string)(nvmlReturn_t);
  nvmlReturn_t (*device_count)(unsigned*);
  nvmlReturn_t (*handle_by_index)(unsigned, nvmlDevice_t*);
  nvmlReturn_t (*handle_by_pci_bus_id)(const char*, nvmlDevice_t*);
  nvmlReturn_t (*device_index)(nvmlDevice_t, unsigned*);
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*);
  nvmlReturn_t (*memory_info)(nvmlDevice_t, nvmlMemory_t*);
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned);
  nvmlReturn_t (*driver_version)(char*, unsigned);
};

Nvml& Nvml::instance() {
  static Nvml nvml(library_path_from_environment());
  return nvml;
}

std::string Nvml::library_path_from_environment() {
  const char* env = std::getenv("PTRAIN_NVML_LIBRARY");
  return env != nullptr && *env != '\0' ? env : "libnvidia-ml.so.1";
}

Nvml::Nvml(const std::string& library_path) {
  library_ = dlopen(library_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library_ == nullptr) {
    const char* err = dlerror();
    reason_ = "cannot load " + library_path + ": " + (err != nullptr ? err : "unknown dlopen error");
    return;
  }
  auto api = std::make_unique<Api>();
  bool missing = false;
  auto bind = [&](auto& fn, const char* symbol) {
    void* p = dlsym(library_, symbol);
    if (p == nullptr && !missing) {
      missing = true;
      reason_ = library_path + " lacks " + symbol;
    }
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
  bind(api->init, "nvmlInit_v2");
  bind(api->shutdown, "nvmlShutdown");
  bind(api->error_string, "nvmlErrorString");
  bind(api->device_count, "nvmlDeviceGetCount_v2");
  bind(api->handle_by_index, "nvmlDeviceGetHandleByIndex_v2");
  bind(api->handle_by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2");
  bind(api->device_index, "nvmlDeviceGetIndex");
  bind(api->utilization, "nvmlDeviceGetUtilizationRates");
  bind(api->memory_info, "nvmlDeviceGetMemoryInfo");
  bind(api->name, "nvmlDeviceGetName");
  bind(api->driver_version, "nvmlSystemGetDriverVersion");
  if (missing) {
    dlclose(library_);
    library_ = nullptr;
    return;
  }
  const nvmlReturn_t rc = api->init();
  if (rc != kNvmlSuccess) {
    reason_ = "nvmlInit_v2 failed: " + std::string(api->error_string(rc));
    dlclose(library_);
    library_ = nullptr;
    return;
  }
  api_ = api.release();
  available_ = true;
}

Nvml::~Nvml() {
  if (available_) api_->shutdown();
  delete api_;
  if (library_ != nullptr) dlclose(library_);
}

void* Nvml::handle_for(int nvml_index) {
  if (!available_ || nvml_index < 0) return nullptr;
  nvmlDevice_t device = nullptr;
  if (api_->handle_by_index(static_cast<unsigned>(nvml_index), &device) != kNvmlSuccess) return nullptr;
  return device;
}

std::vector<Nvml::Device> Nvml::devices() {
  std::vector<Device> out;
  unsigned count = 0;
  if (!available_ || api_->device_count(&count) != kNvmlSuccess) return out;
  for (unsigned i = 0; i < count; ++i) {
    const auto name = device_name(static_cast<int>(i));
    const auto total = memory_total_bytes(static_cast<int>(i));
    if (name && total) out.push_back({static_cast<int>(i), *name, *total});
  }
  return out;
}

std::optional<unsigned> Nvml::utilization_percent(int nvml_index) {
  auto device = static_cast<nvmlDevice_t>(handle_for(nvml_index));
  nvmlUtilization_t u{};
  if (device == nullptr || api_->utilization(device, &u) != kNvmlSuccess) return std::nullopt;
  return u.gpu;
}

std::optional<uint64_t> Nvml::memory_used_bytes(int nvml_index) {
  auto device = static_cast<nvmlDevice_t>(handle_for(nvml_index));
  nvmlMemory_t m{};
  if (device == nullptr || api_->memory_info(device, &m) != kNvmlSuccess) return std::nullopt;
  return m.used;
}

std::optional<uint64_t> Nvml::memory_total_bytes(int nvml_index) {
  auto device = static_cast<nvmlDevice_t>(handle_for(nvml_index));
  nvmlMemory_t m{};
  if (device == nullptr || api_->memory_info(device, &m) != kNvmlSuccess) return std::nullopt;
  return m.total;
}

std::optional<std::string> Nvml::device_name(int nvml_index) {
  auto device = static_cast<nvmlDevice_t>(handle_for(nvml_index));
  char buffer[kDeviceNameBufferSize] = {};
  if (device == nullptr || api_->name(device, buffer, sizeof buffer) != kNvmlSuccess) return std::nullopt;
  return std::string(buffer);
}

std::optional<std::string> Nvml::driver_version() {
  char buffer[kDriverVersionBufferSize] = {};
  if (!available_ || api_->driver_version(buffer, sizeof buffer) != kNvmlSuccess) return std::nullopt;
  return std::string(buffer);
}

std::optional<int> Nvml::index_for_pci_bus_id(const std::string& pci_bus_id) {
  nvmlDevice_t device = nullptr;
  unsigned index = 0;
  if (!available_ || api_->handle_by_pci_bus_id(pci_bus_id.c_str(), &device) != kNvmlSuccess ||
      api_->device_index(device, &index) != kNvmlSuccess) {
    return std::nullopt;
  }
  return static_cast<int>(index);
}

}  // namespace ptrain::metrics
