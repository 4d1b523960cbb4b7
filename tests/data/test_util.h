// Helpers shared by the data tests: a scratch directory per test and the Python oracle.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ptrain/core/error.h"
#include "remove_tree.h"

namespace ptrain::data::testing {

// A fresh directory named after the running test, removed at the end of the test.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("ptrain_data_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" +
             std::to_string(::getpid()));
    ptrain::testing::remove_tree(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { ptrain::testing::remove_tree(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::string oracle_script(const std::string& name) {
  return std::string(PTRAIN_SOURCE_DIR) + "/tests/oracles/" + name;
}

// Runs the oracle Python with a script from tests/oracles and its arguments; fails the test if it fails.
inline void run_oracle(const std::string& script, const std::string& arguments) {
  const std::string command = std::string(PTRAIN_ORACLE_PYTHON) + " " + oracle_script(script) + " " + arguments;
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

// The oracle's standard output.
inline std::string oracle_output(const std::string& script, const std::string& arguments) {
  const std::string command = std::string(PTRAIN_ORACLE_PYTHON) + " " + oracle_script(script) + " " + arguments;
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return output;
  char buffer[4096];
  size_t got = 0;
  while ((got = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, got);
  EXPECT_EQ(pclose(pipe), 0) << command;
  return output;
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Expects `call` to throw ptrain::Error whose message contains every one of `parts`.
template <typename Call>
void expect_error_mentioning(Call&& call, const std::vector<std::string>& parts) {
  try {
    call();
    ADD_FAILURE() << "expected ptrain::Error mentioning " << parts.front();
  } catch (const ptrain::Error& e) {
    const std::string message = e.what();
    for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message << "\nlacks: " << part;
  }
}

}  // namespace ptrain::data::testing
