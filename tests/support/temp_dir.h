// Scratch directories for tests: a private one per test, or one named for a test that keeps it after.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "remove_tree.h"
#include "scratch_dirs.h"

namespace ptrain::testing {

// Made fresh (mkdtemp) and removed with everything in it when the test ends; each ctest entry is its own
// process, so tests running in parallel never share one.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "ptrain_test_XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  // A failed test's directory is kept, and named, for inspection.
  ~TempDir() { release_scratch_dir(path_, ::testing::Test::HasFailure()); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::filesystem::path dir() const { return path_; }
  std::string file(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }
  std::string operator/(const std::string& name) const { return file(name); }

 private:
  std::string path_;
};

// The path <tmp>/ptrain_<name>_<pid>, nothing there, for a test to make: removed when the test ends and kept
// (and named) when it failed, as temp_dir's (scratch_dirs.h).
inline std::filesystem::path named_scratch_path(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("ptrain_" + name + "_" + std::to_string(::getpid()));
  remove_tree(dir);
  scratch_dirs_of_this_test().push_back(dir.string());
  return dir;
}

// named_scratch_path's directory, made empty.
inline std::filesystem::path fresh_named_dir(const std::string& name) {
  const auto dir = named_scratch_path(name);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace ptrain::testing
