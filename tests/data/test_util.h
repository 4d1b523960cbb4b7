// Helpers shared by the data tests, over tests/support's TempDir and oracle runner.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ptrain/core/error.h"
#include "oracle.h"
#include "temp_dir.h"

namespace ptrain::data::testing {

// tests/support's TempDir, its path as a std::filesystem::path as the data tests use it.
class ScratchDir : public ptrain::testing::TempDir {
 public:
  std::filesystem::path path() const { return dir(); }
};

using ptrain::testing::oracle_script;

// Runs the oracle Python with a script from tests/oracles and its arguments; fails the test if it fails.
inline void run_oracle(const std::string& script, const std::string& arguments) {
  const auto oracle = ptrain::testing::run_oracle(script, arguments);
  ASSERT_EQ(oracle.exit_code, 0) << script << " " << arguments << "\n" << oracle.output;
}

// The oracle's standard output.
inline std::string oracle_output(const std::string& script, const std::string& arguments) {
  const auto oracle = ptrain::testing::run_oracle(script, arguments, ptrain::testing::Stderr::Kept);
  EXPECT_EQ(oracle.exit_code, 0) << script << " " << arguments;
  return oracle.output;
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
