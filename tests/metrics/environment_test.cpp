#include <gtest/gtest.h>

#include <dlfcn.h>
#include <limits.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>

#include "ptrain/core/torch_compat.h"
#include "ptrain/metrics/environment.h"
#include "command.h"

namespace {

std::string output_of(const std::string& command) {
  std::string out = ptrain::testing::run_command(command, ptrain::testing::Stderr::Dropped).output;
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// POSIX realpath, not std::filesystem: LibTorch 2.x wheels export their own copies of the latter.
std::string real_path(const std::string& path) {
  char* resolved = ::realpath(path.c_str(), nullptr);
  if (resolved == nullptr) return path;
  std::string out = resolved;
  std::free(resolved);
  return out;
}

}  // namespace

TEST(Environment, CpuRunsNameLibTorchAndNoGpu) {
  const auto env = ptrain::metrics::describe_environment(torch::Device(torch::kCPU));
  EXPECT_EQ(env["torch_version"], ptrain::compat::torch_version());
  EXPECT_EQ(env["device"], "cpu");
  EXPECT_EQ(env["ptrain_commit"], ptrain::metrics::source_commit());
  EXPECT_FALSE(env.contains("gpu_name")) << "a CPU run must not claim a GPU";
  EXPECT_FALSE(env.contains("driver_version"));
  EXPECT_FALSE(env.contains("gpu_count"));
}

// The commit comes from CMake's configure step; in a checkout whose top is the source folder it is HEAD's
// (this test's build is configured again when HEAD moves).
TEST(Environment, SourceCommitIsTheCheckoutsHeadOrUnknown) {
  const std::string commit = ptrain::metrics::source_commit();
  EXPECT_EQ(commit, PTRAIN_SOURCE_COMMIT_EXPECTED);
  EXPECT_TRUE(commit == "unknown" || std::regex_match(commit, std::regex("[0-9a-f]{40}"))) << commit;
  const std::string top = output_of("git -C '" PTRAIN_SOURCE_DIR "' rev-parse --show-toplevel");
  if (!top.empty() && real_path(top) == real_path(PTRAIN_SOURCE_DIR)) {
    EXPECT_EQ(commit, output_of("git -C '" PTRAIN_SOURCE_DIR "' rev-parse HEAD"));
  }
}

// Versions come from the libraries' own entry points in whatever the process loaded, written as PyTorch
// writes them; stand-ins with known answers take the place of CUDA, cuDNN and NCCL here.
TEST(Environment, VersionsOfTheLoadedCudaLibrariesInPytorchsNotation) {
  if (ptrain::metrics::loaded_cuda_runtime_version()) GTEST_SKIP() << "a real CUDA runtime is loaded";
  EXPECT_FALSE(ptrain::metrics::loaded_nccl_version());
  void* fake = ::dlopen(PTRAIN_FAKE_CUDA_LIBRARIES, RTLD_NOW | RTLD_GLOBAL);
  ASSERT_NE(fake, nullptr) << ::dlerror();
  EXPECT_EQ(ptrain::metrics::loaded_cuda_runtime_version(), "12.4");
  EXPECT_EQ(ptrain::metrics::loaded_cudnn_version(), "90100");
  EXPECT_EQ(ptrain::metrics::loaded_nccl_version(), "2.21.6");
  const auto env = ptrain::metrics::describe_environment(torch::Device(torch::kCPU));
  EXPECT_EQ(env["cuda_version"], "12.4");
  EXPECT_EQ(env["nccl_version"], "2.21.6");
}
