// Helpers shared by the train tests: a scratch directory and running the Python oracles.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace ptrain::testing {

inline std::filesystem::path scratch_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("ptrain_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline void run_oracle(const std::string& script_and_args) {
  const std::string command = std::string(PTRAIN_ORACLE_PYTHON) + " " + PTRAIN_SOURCE_DIR + "/tests/oracles/" +
                              script_and_args;
  ASSERT_EQ(std::system(command.c_str()), 0) << "oracle failed: " << command;
}

inline double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  return (got.to(torch::kDouble) - want.to(torch::kDouble)).norm().item<double>() /
         std::max(1e-30, want.to(torch::kDouble).norm().item<double>());
}

}  // namespace ptrain::testing
