// Skips a test without a CUDA device: the fused kernels exist only there.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ptrain/kernels/cross_entropy.h"

#define PTRAIN_REQUIRE_CUDA_KERNELS()                                                                           \
  do {                                                                                                         \
    if (!torch::cuda::is_available() || !ptrain::kernels::fused_kernels_available(torch::Device(torch::kCUDA, 0))) \
      GTEST_SKIP() << "needs a CUDA device and a CUDA build (runs on the GPU machine: scripts/gpu_session.sh test)"; \
  } while (0)

inline double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  const auto g = got.to(torch::kCPU, torch::kDouble), w = want.to(torch::kCPU, torch::kDouble);
  return (g - w).norm().item<double>() / std::max(1e-30, w.norm().item<double>());
}
