#include "ptrain/bench/command_process.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <fstream>
#include <ostream>

#include "ptrain/bench/failure_line.h"
#include "ptrain/core/error.h"

namespace ptrain::bench {

namespace {

// Ctrl-C or SIGTERM for the bench, as the signal handler saw it.
volatile std::sig_atomic_t stop_signal = 0;
void remember_stop_signal(int signal_number) { stop_signal = signal_number; }

bool is_progress_line(const std::string& line) {
  const auto at = line.find("epoch ");
  return at != std::string::npos && (at == 0 || line.rfind("[rank 0] ", 0) == 0 || line.rfind("[pytorch]", 0) == 0);
}

// Between SIGINT and SIGKILL when a run is stopped: time for ranks to leave their collectives.
constexpr double kKillGraceSeconds = 20;

}  // namespace

CommandExit run_in_process_group(const std::string& command, const std::string& log_path, const std::string& prefix,
                                 ProgressSink& progress, int64_t timeout_seconds,
                                 std::optional<std::chrono::steady_clock::time_point> time_limit) {
  std::ofstream log(log_path);
  log << "$ " << command << "\n";
  log.flush();
  int fds[2];
  check(::pipe(fds) == 0, "cannot start (no pipe): " + command);
  const pid_t pid = ::fork();
  check(pid >= 0, "cannot start (fork failed): " + command);
  if (pid == 0) {
    ::setpgid(0, 0);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: the child may not have run yet when a signal must reach its group
  ::close(fds[1]);

  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  std::optional<Clock::time_point> kill_at;
  CommandExit exit;
  enum class Why { interrupted, timed_out, time_limit };
  auto stop = [&](Why why) {
    if (kill_at) return;
    exit.timed_out = why == Why::timed_out;
    exit.at_time_limit = why == Why::time_limit;
    exit.interrupted = why == Why::interrupted;
    ::kill(-pid, SIGINT);
    kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kKillGraceSeconds));
  };
  std::string line;
  std::string output;  // what the run wrote, for the line that says why it failed
  std::array<char, 4096> buffer{};
  for (;;) {
    pollfd readable{fds[0], POLLIN, 0};
    const int ready = ::poll(&readable, 1, 200);
    if (stop_requested()) stop(Why::interrupted);
    if (timeout_seconds > 0 && Clock::now() - started > std::chrono::seconds(timeout_seconds)) stop(Why::timed_out);
    if (time_limit && Clock::now() > *time_limit) stop(Why::time_limit);
    if (kill_at && Clock::now() > *kill_at) ::kill(-pid, SIGKILL);
    if (ready <= 0) continue;
    const ssize_t n = ::read(fds[0], buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // every writer closed its end: the run is over
    for (ssize_t i = 0; i < n; ++i) {
      if (buffer[i] != '\n') {
        line += buffer[i];
        continue;
      }
      log << line << "\n";
      output += line + "\n";
      if (!line.empty()) exit.last_line = line;
      if (is_progress_line(line)) progress.line(prefix + line);
      line.clear();
    }
    log.flush();
  }
  ::close(fds[0]);
  if (!line.empty()) {
    log << line << "\n";
    output += line + "\n";
    exit.last_line = line;
  }
  exit.error_line = failure_line(output);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  ::kill(-pid, SIGKILL);  // whatever of the run detached from the pipe goes with it
  exit.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  if (exit.timed_out) log << "(stopped by ptrain bench after the --run-timeout of " << timeout_seconds << " s)\n";
  if (exit.at_time_limit) log << "(stopped by ptrain bench at its --time-limit; the next bench runs it again)\n";
  return exit;
}

InterruptRelay::InterruptRelay() {
  stop_signal = 0;
  struct sigaction action {};
  action.sa_handler = remember_stop_signal;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, &old_int_);
  ::sigaction(SIGTERM, &action, &old_term_);
}

InterruptRelay::~InterruptRelay() {
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
}

bool stop_requested() { return stop_signal != 0; }

void ProgressSink::line(const std::string& text) {
  std::lock_guard<std::mutex> lock(mutex_);
  out_ << text << std::endl;
}

std::string gpu_list(const std::vector<int64_t>& gpus) {
  std::string list;
  for (auto g : gpus) list += (list.empty() ? "" : ",") + std::to_string(g);
  return list;
}

std::string command_on_gpus(const std::string& command, const std::vector<int64_t>& gpus) {
  // Exported, not a prefix of the command: a prefix reaches only the first command of `a && b; c`.
  return gpus.empty() ? command : "export CUDA_VISIBLE_DEVICES=" + gpu_list(gpus) + "; " + command;
}

}  // namespace ptrain::bench
