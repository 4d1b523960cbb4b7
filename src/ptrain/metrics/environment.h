// Where a run ran: the facts a result needs beside it to be compared (GPU, driver, CUDA, cuDNN, NCCL,
// LibTorch, the ptrain commit).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace ptrain::metrics {

// NVML numbers devices in PCI order, CUDA in its own: the PCI bus id ties the two together.
// -1 when NVML or the device is not there.
int nvml_index_for_cuda_device(int cuda_index);

// {"torch_version", "device", "ptrain_commit"; for CUDA devices "gpu_name", "driver_version" (when NVML
// knows them), "gpu_count"; and "cuda_version", "cudnn_version", "nccl_version" of the libraries LibTorch
// loaded, where it loaded them}. Versions are written as PyTorch writes them: "13.0", "91900", "2.28.9".
nlohmann::json describe_environment(const torch::Device& device);

// The commit this ptrain was built from (cmake/SourceCommit.cmake), or "unknown".
const char* source_commit();

// The versions of the CUDA runtime, cuDNN and NCCL in this process, in PyTorch's notation; nullopt for
// a library that is not loaded (every one of them on a CPU build).
std::optional<std::string> loaded_cuda_runtime_version();
std::optional<std::string> loaded_cudnn_version();
std::optional<std::string> loaded_nccl_version();

}  // namespace ptrain::metrics
