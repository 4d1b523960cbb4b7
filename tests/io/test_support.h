// Helpers shared by the io and models tests: a private temporary directory per test, and running the
// oracle Python (Debian's python3 with torch and torchvision) on scripts in tests/oracles.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "remove_tree.h"

namespace ptrain::testing {

// Removed with everything in it when the test ends; each ctest entry is its own process, so tests
// running in parallel never share one.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "ptrain_test_XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    remove_tree(path_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct OracleResult {
  int exit_code;
  std::string output;
};

inline std::string oracle_script(const std::string& name) {
  return std::string(PTRAIN_SOURCE_DIR) + "/tests/oracles/" + name;
}

// Runs `PTRAIN_ORACLE_PYTHON tests/oracles/<script> <args>` with stderr folded into the output, so that
// a failing oracle explains itself in the assertion message.
inline OracleResult run_oracle(const std::string& script, const std::string& args) {
  const std::string command =
      std::string(PTRAIN_ORACLE_PYTHON) + " " + oracle_script(script) + " " + args + " 2>&1";
  OracleResult result{-1, ""};
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer{};
  size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs body, which must throw, and returns the message (failing the test when nothing is thrown).
template <typename Exception, typename Body>
std::string error_message(Body&& body) {
  try {
    body();
  } catch (const Exception& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

}  // namespace ptrain::testing
