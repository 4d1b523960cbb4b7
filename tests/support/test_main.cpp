// The main of every GoogleTest binary of ptrain. Without flags of its own it is gtest_main.
//
// With --ptrain_fork_each_case it runs no case itself: it forks a child for each case its --gtest_filter selects
// and waits for each in turn, so that the cases of one ctest entry share one start-up. Starting a test process
// costs about 0.5 s of CPU (LibTorch's static initialisation registers thousands of operators) whatever the case
// does, and cases that fork ranks cannot share a process: forked ranks need a parent that did no LibTorch work
// yet (its OpenMP and intra-op threads are not carried over a fork). Each child starts where a fresh process
// starts, LibTorch initialised and nothing run, and its resource counters (peak RSS, CPU time) begin at the fork.
// Either way the process ends without static destructors (end_process).
// gtest's own death tests fork too, but keep the parent running the cases, which is what must not happen here.
#include <fnmatch.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "scratch_dirs.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

// A named namespace, not an anonymous one: unity builds compile this file in one batch with test sources
// whose own helpers may share these names.
namespace ptrain_test_main {

constexpr const char* kForkEachCase = "--ptrain_fork_each_case";

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string::size_type start = 0;
  while (start <= text.size()) {
    const auto end = text.find(separator, start);
    const auto part = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!part.empty()) parts.push_back(part);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return parts;
}

bool matches_any(const std::string& name, const std::vector<std::string>& patterns) {
  for (const auto& pattern : patterns) {
    if (::fnmatch(pattern.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

// gtest's filter grammar: positive patterns, then optionally '-' and negative ones, each list ':'-separated,
// '*' and '?' as wildcards.
bool selected_by_filter(const std::string& name, const std::string& filter) {
  const auto dash = filter.find('-');
  const std::string positive = filter.substr(0, dash);
  const std::string negative = dash == std::string::npos ? std::string() : filter.substr(dash + 1);
  return matches_any(name, split(positive.empty() ? std::string("*") : positive, ':')) &&
         !matches_any(name, split(negative, ':'));
}

std::vector<std::string> selected_cases() {
  const std::string filter = GTEST_FLAG_GET(filter);
  const bool disabled_too = GTEST_FLAG_GET(also_run_disabled_tests);
  std::vector<std::string> names;
  const auto* unit = ::testing::UnitTest::GetInstance();
  for (int s = 0; s < unit->total_test_suite_count(); ++s) {
    const auto* suite = unit->GetTestSuite(s);
    for (int c = 0; c < suite->total_test_count(); ++c) {
      const std::string name = std::string(suite->name()) + "." + suite->GetTestInfo(c)->name();
      const bool disabled = std::strncmp(suite->name(), "DISABLED_", 9) == 0 ||
                            std::strncmp(suite->GetTestInfo(c)->name(), "DISABLED_", 9) == 0;
      if ((!disabled || disabled_too) && selected_by_filter(name, filter)) names.push_back(name);
    }
  }
  return names;
}

// Ends the process without its static destructors: LibTorch's deregister its thousands of operators one by one,
// about 80 ms of every process (perf, `ptrain --version`), and the cases and gtest's reports are done by now.
[[noreturn]] void end_process(int code) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(code);
}

// Runs one case in a forked child; returns "" when it passed, else how it ended.
std::string run_in_child(const std::string& name) {
  std::fflush(nullptr);  // what is buffered here would otherwise be printed again by the child
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) return std::string("fork failed: ") + std::strerror(errno);
  if (child == 0) {
    // A parent killed by ctest's timeout takes its running case with it.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) std::_Exit(1);
    GTEST_FLAG_SET(filter, name);
    end_process(RUN_ALL_TESTS());
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) return std::string("waitpid failed: ") + std::strerror(errno);
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status) == 0 ? "" : "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  }
  return "ended without an exit status";
}

int fork_each_case() {
  const auto names = selected_cases();
  if (names.empty()) {
    std::fprintf(stderr, "%s: --gtest_filter=%s selects no case\n", kForkEachCase, GTEST_FLAG_GET(filter).c_str());
    return 1;
  }
  std::vector<std::string> failures;
  for (const auto& name : names) {
    const auto failure = run_in_child(name);
    if (!failure.empty()) {
      // A child that crashed or was killed printed no gtest verdict of its own.
      std::printf("[  FAILED  ] %s (%s)\n", name.c_str(), failure.c_str());
      failures.push_back(name + " (" + failure + ")");
    }
  }
  std::printf("\n[ptrain] %zu cases, each in a process forked from this one: %zu passed, %zu failed\n", names.size(),
              names.size() - failures.size(), failures.size());
  for (const auto& failure : failures) std::printf("[ptrain] FAILED %s\n", failure.c_str());
  std::fflush(nullptr);
  return failures.empty() ? 0 : 1;
}

// Removes the scratch directories a test made (scratch_dirs.h) when it ends, or names them if it failed.
class RemoveScratchDirs : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo& info) override {
    auto& dirs = ptrain::testing::scratch_dirs_of_this_test();
    for (const auto& dir : dirs) ptrain::testing::release_scratch_dir(dir, info.result()->Failed());
    dirs.clear();
  }
};

}  // namespace ptrain_test_main

int main(int argc, char** argv) {
  bool fork_each = false;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], ptrain_test_main::kForkEachCase) == 0) {
      fork_each = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  argv[argc] = nullptr;
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::UnitTest::GetInstance()->listeners().Append(new ptrain_test_main::RemoveScratchDirs);
  ptrain_test_main::end_process(fork_each ? ptrain_test_main::fork_each_case() : RUN_ALL_TESTS());
}
