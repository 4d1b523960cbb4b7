#include <gtest/gtest.h>

#include "ptrain/core/torch_compat.h"
#include "ptrain/metrics/environment.h"

TEST(Environment, CpuRunsNameLibTorchAndNoGpu) {
  const auto env = ptrain::metrics::describe_environment(torch::Device(torch::kCPU));
  EXPECT_EQ(env["torch_version"], ptrain::compat::torch_version());
  EXPECT_EQ(env["device"], "cpu");
  EXPECT_FALSE(env.contains("gpu_name")) << "a CPU run must not claim a GPU";
  EXPECT_FALSE(env.contains("driver_version"));
}
