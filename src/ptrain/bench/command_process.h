// A run's processes: its shell command started in a process group of its own, its output copied into its
// log (and its progress lines to the bench's), and every process of it stopped together at a timeout, at
// the bench's time limit or on Ctrl-C. Internal to bench/.
#pragma once

#include <csignal>
#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace ptrain::bench {

// Catches Ctrl-C and SIGTERM for the bench while it lives (and puts the previous handlers back after):
// every running command passes the signal on to its process group, and the bench stops after them.
class InterruptRelay {
 public:
  InterruptRelay();
  ~InterruptRelay();
  InterruptRelay(const InterruptRelay&) = delete;
  InterruptRelay& operator=(const InterruptRelay&) = delete;

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

// Whether Ctrl-C or SIGTERM reached the bench since InterruptRelay was made.
bool stop_requested();

// Progress lines from runs that may run side by side: whole lines, one writer at a time.
class ProgressSink {
 public:
  explicit ProgressSink(std::ostream& out) : out_(out) {}
  void line(const std::string& text);

 private:
  std::ostream& out_;
  std::mutex mutex_;
};

struct CommandExit {
  int code = 0;
  bool interrupted = false;    // the bench was asked to stop (Ctrl-C, SIGTERM) while the run went on
  bool timed_out = false;      // stopped at the run timeout
  bool at_time_limit = false;  // stopped at the bench's time limit, left for the next bench
  std::string last_line;
  std::string error_line;  // the line of its output that says why it failed (failure_line.h)
};

// Runs command with /bin/sh in a process group of its own, so that a timeout or Ctrl-C reaches every
// process of the run (ptrain launch's ranks, torchrun's workers) and no process outlives it. Its output
// (stdout and stderr) goes to log_path, after a line "$ command"; its progress lines also to progress, after
// prefix. Stopped (SIGINT, then SIGKILL after a grace period) after timeout_seconds (0: no limit), at
// time_limit, or when stop_requested().
CommandExit run_in_process_group(const std::string& command, const std::string& log_path, const std::string& prefix,
                                 ProgressSink& progress, int64_t timeout_seconds,
                                 std::optional<std::chrono::steady_clock::time_point> time_limit);

// "0,1,3", as CUDA_VISIBLE_DEVICES lists GPUs.
std::string gpu_list(const std::vector<int64_t>& gpus);
// The shell command that runs command with only these GPUs visible (all of them when gpus is empty),
// every process of a compound command included.
std::string command_on_gpus(const std::string& command, const std::vector<int64_t>& gpus);

}  // namespace ptrain::bench
