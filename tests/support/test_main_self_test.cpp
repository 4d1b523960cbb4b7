// Cases for test_main_self_test.py, which runs them under --ptrain_fork_each_case (tests/support/test_main.cpp)
// and checks what a ctest entry relies on: each case in its own child of the entry's process, a failing or
// crashing case named and the entry failed, gtest's filter honoured.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

namespace {

int cases_run_in_this_process = 0;

// Each case notes its process and parent in the file PTRAIN_SELF_TEST_LOG names, and that it is the first
// case its process runs.
void note_process(const char* name) {
  ++cases_run_in_this_process;
  if (const char* log = std::getenv("PTRAIN_SELF_TEST_LOG")) {
    std::ofstream(log, std::ios::app) << name << ' ' << ::getpid() << ' ' << ::getppid() << ' '
                                      << cases_run_in_this_process << '\n';
  }
}

TEST(ForkEachCase, First) { note_process("First"); }

TEST(ForkEachCase, Second) { note_process("Second"); }

TEST(ForkEachCase, Fails) {
  note_process("Fails");
  EXPECT_EQ(std::getenv("PTRAIN_SELF_TEST_FAIL"), nullptr) << "asked to fail";
}

TEST(ForkEachCase, Crashes) {
  note_process("Crashes");
  if (std::getenv("PTRAIN_SELF_TEST_CRASH") != nullptr) std::abort();
}

TEST(ForkEachCase, DISABLED_NeverRuns) { note_process("NeverRuns"); }

}  // namespace
