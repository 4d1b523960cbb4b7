// NVIDIA's management library, opened at run time with dlopen("libnvidia-ml.so.1"): ptrain builds
// without the CUDA toolkit and runs on machines without a driver, where every query answers nullopt
// ("n/a") instead of a number. PTRAIN_NVML_LIBRARY overrides the library path.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ptrain::metrics {

class Nvml {
 public:
  // The process-wide instance, opened on first use from library_path_from_environment().
  static Nvml& instance();
  // $PTRAIN_NVML_LIBRARY when set and non-empty, else "libnvidia-ml.so.1".
  static std::string library_path_from_environment();

  // Opens and initialises NVML from library_path; never throws: failure is reported by available().
  explicit Nvml(const std::string& library_path);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool available() const { return available_; }
  // Why available() is false (library missing, symbol missing, nvmlInit failed); empty when available.
  std::string unavailable_reason() const { return reason_; }

  struct Device {
    int nvml_index;
    std::string name;
    uint64_t memory_total_bytes;
  };
  std::vector<Device> devices();

  // Device-wide: every process on the GPU counts, not only this one.
  std::optional<unsigned> utilization_percent(int nvml_index);
  std::optional<uint64_t> memory_used_bytes(int nvml_index);
  std::optional<uint64_t> memory_total_bytes(int nvml_index);
  std::optional<std::string> device_name(int nvml_index);
  std::optional<std::string> driver_version();
  // NVML's index for a PCI bus id such as "0000:3B:00.0" (what cudaDeviceGetPCIBusId gives): CUDA and
  // NVML number devices differently once CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER is in play.
  std::optional<int> index_for_pci_bus_id(const std::string& pci_bus_id);

 private:
  struct Api;
  void* handle_for(int nvml_index);

  void* library_ = nullptr;
  Api* api_ = nullptr;
  bool available_ = false;
  std::string reason_;
};

}  // namespace ptrain::metrics
