// Named scratch directories that outlive one function of a test (a rank's files, a run's checkpoints): made
// fresh under /tmp and removed when the test that made them ends (test_main.cpp's listener), kept and named
// when it failed. Forked ranks end with _exit and never run the listener, so only the test's own process removes
// what it made.
#pragma once

#include <stdlib.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "remove_tree.h"

namespace ptrain::testing {

// The directories temp_dir made in this process since the last test ended.
inline std::vector<std::string>& scratch_dirs_of_this_test() {
  static std::vector<std::string> dirs;
  return dirs;
}

// A test's scratch directory at its end: removed, or kept and named for inspection when the test failed.
inline void release_scratch_dir(const std::string& dir, bool test_failed) {
  if (test_failed) {
    std::fprintf(stderr, "kept %s for inspection\n", dir.c_str());
  } else {
    remove_tree(dir);
  }
}

inline std::string temp_dir(const std::string& name) {
  std::string pattern = "/tmp/ptrain_" + name + "_XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("temp_dir: mkdtemp failed for " + pattern);
  scratch_dirs_of_this_test().push_back(pattern);
  return pattern;
}

}  // namespace ptrain::testing
