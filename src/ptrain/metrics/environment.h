// Where a run ran: the facts a result needs beside it to be compared (GPU, driver, LibTorch).
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace ptrain::metrics {

// NVML numbers devices in PCI order, CUDA in its own: the PCI bus id ties the two together.
// -1 when NVML or the device is not there.
int nvml_index_for_cuda_device(int cuda_index);

// {"torch_version", "device", and for CUDA devices "gpu_name", "driver_version" when NVML knows them}.
nlohmann::json describe_environment(const torch::Device& device);

}  // namespace ptrain::metrics
