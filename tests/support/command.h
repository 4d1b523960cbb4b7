// Running a shell command line from a test and keeping what it printed and how it ended.
#pragma once

#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>

namespace ptrain::testing {

struct CommandResult {
  int exit_code = -1;  // the command's exit status; 128 + N when signal N ended it; -1 when it could not start
  std::string output;  // standard output, with standard error folded in unless asked otherwise
  double seconds = 0;  // wall time from start to exit
};

enum class Stderr { Merged, Dropped, Kept };

// Runs command_line with /bin/sh (popen), reading its output to the end.
inline CommandResult run_command(const std::string& command_line, Stderr stderr_mode = Stderr::Merged) {
  std::string command = command_line;
  if (stderr_mode == Stderr::Merged) command += " 2>&1";
  if (stderr_mode == Stderr::Dropped) command += " 2>/dev/null";
  CommandResult result;
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer{};
  while (size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe)) result.output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
  return result;
}

}  // namespace ptrain::testing
