// Helpers shared by the tests of several concerns, over tests/support's TempDir and oracle runner: bytes in and
// out of files, and the message of an expected exception.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "oracle.h"
#include "temp_dir.h"

namespace ptrain::testing {

using OracleResult = CommandResult;

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
