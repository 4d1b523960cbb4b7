#include "ptrain/distributed/launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include <torch/cuda.h>

#include "ptrain/core/error.h"
#include "ptrain/distributed/cpu_threads.h"
#include "ptrain/distributed/ports.h"

extern char** environ;

namespace ptrain::distributed {
namespace {

volatile sig_atomic_t received_signal = 0;

void remember_signal(int signal_number) { received_signal = signal_number; }

struct Child {
  int local_rank = 0;
  int64_t rank = 0;
  pid_t pid = -1;
  bool running = false;
  int exit_code = 0;
  int term_signal = 0;  // the signal that ended it, 0 when it exited (exit_code 128 + N could be either)
  std::vector<std::thread> readers;
};

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the reader of our output went away; keep draining the child regardless
    done += static_cast<size_t>(n);
  }
}

// Copies one child stream to out_fd line by line, so lines of different ranks never interleave.
void forward_lines(int in_fd, int out_fd, const std::string& prefix, std::mutex& output_mutex) {
  std::string pending;
  char buffer[4096];
  while (true) {
    const ssize_t n = ::read(in_fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buffer, static_cast<size_t>(n));
    size_t newline;
    std::string lines;
    while ((newline = pending.find('\n')) != std::string::npos) {
      lines += prefix + pending.substr(0, newline + 1);
      pending.erase(0, newline + 1);
    }
    if (!lines.empty()) {
      std::lock_guard<std::mutex> lock(output_mutex);
      write_all(out_fd, lines);
    }
  }
  if (!pending.empty()) {
    std::lock_guard<std::mutex> lock(output_mutex);
    write_all(out_fd, prefix + pending + "\n");
  }
  ::close(in_fd);
}

using Variables = std::vector<std::pair<std::string, std::string>>;

// extra: variables the same for every rank of this node (run id, threads), set over the launcher's own.
std::vector<std::string> child_environment(const LaunchOptions& o, int local_rank, const Variables& extra) {
  const int64_t world = static_cast<int64_t>(o.nnodes) * o.nproc_per_node;
  const int64_t rank = static_cast<int64_t>(o.node_rank) * o.nproc_per_node + local_rank;
  Variables overrides{
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(o.master_port)},
  };
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string key = entry.substr(0, entry.find('='));
    const bool overridden =
        std::any_of(overrides.begin(), overrides.end(), [&](const auto& kv) { return kv.first == key; });
    if (!overridden) env.push_back(entry);
  }
  for (const auto& [key, value] : overrides) env.push_back(key + "=" + value);
  return env;
}

void signal_all(std::vector<Child>& children, int signal_number) {
  for (auto& c : children) {
    // Each rank leads its own process group, so its helpers (data workers, shells) get the signal too.
    if (c.running && c.pid > 0) ::kill(-c.pid, signal_number);
  }
}

int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

bool usage_error(const Child& c) { return c.term_signal == 0 && c.exit_code == kUsageErrorExitCode; }

// Reaps whatever has exited; returns the index of the child whose failure is the cause, or -1. A rank
// that loses its peer fails too, with ptrain's error code, moments after the peer died: found in the same
// pass, a rank that failed otherwise (killed, crashed) is the cause, else the lowest rank that failed.
int reap(std::vector<Child>& children, bool block) {
  int failed = -1;
  int failed_otherwise = -1;
  for (size_t i = 0; i < children.size(); ++i) {
    auto& c = children[i];
    if (!c.running) continue;
    int status = 0;
    const pid_t done = ::waitpid(c.pid, &status, block ? 0 : WNOHANG);
    if (done == c.pid) {
      c.running = false;
      c.exit_code = decode_status(status);
      c.term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      if (c.exit_code != 0 && failed < 0) failed = static_cast<int>(i);
      if (c.exit_code != 0 && !usage_error(c) && failed_otherwise < 0) failed_otherwise = static_cast<int>(i);
    }
  }
  return failed_otherwise >= 0 ? failed_otherwise : failed;
}

bool any_running(const std::vector<Child>& children) {
  return std::any_of(children.begin(), children.end(), [](const Child& c) { return c.running; });
}

void stop_all(std::vector<Child>& children, double grace_seconds, int first_signal) {
  signal_all(children, first_signal);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_seconds);
  while (any_running(children) && std::chrono::steady_clock::now() < deadline) {
    reap(children, false);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  signal_all(children, SIGKILL);
  while (any_running(children)) reap(children, true);
  // The ranks are gone; leftovers of their process groups (which could keep output pipes open) go too.
  for (auto& c : children)
    if (c.pid > 0) ::kill(-c.pid, SIGKILL);
}

// The program as execvp would find it, looked up before fork: after fork the child may only make
// async-signal-safe calls (the reader threads of earlier ranks hold locks the child would inherit).
std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t colon = std::min(dirs.find(':', start), dirs.size());
    const std::string dir = dirs.substr(start, colon - start);
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    struct stat info {};
    if (::stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    start = colon + 1;
  }
  return name;  // execve fails with ENOENT, reported like any other failure to start
}

// Starts one rank: its own process group (so that stopping it reaches its helpers too), killed by the
// kernel when the launcher dies (PR_SET_PDEATHSIG: a `kill -9` of ptrain launch must not leave ranks
// training with no one to collect them), stdout and stderr on the pipes, default signal handling.
// Returns the pid, or throws with the reason exec failed.
pid_t start_rank(const std::string& program, char* const argv[], char* const envp[], int out_fd, int err_fd) {
  int status_pipe[2];
  if (::pipe2(status_pipe, O_CLOEXEC) != 0) throw Error(std::string("launch: cannot create a pipe: ") + std::strerror(errno));
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int error = errno;
    ::close(status_pipe[0]);
    ::close(status_pipe[1]);
    throw Error(std::string("launch: cannot fork: ") + std::strerror(error));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) ::_exit(127);  // the launcher died before prctl took effect
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    sigemptyset(&default_action.sa_mask);
    for (const int signal_number : {SIGINT, SIGTERM, SIGPIPE}) ::sigaction(signal_number, &default_action, nullptr);
    sigset_t empty_mask;
    sigemptyset(&empty_mask);
    ::sigprocmask(SIG_SETMASK, &empty_mask, nullptr);
    ::execve(program.c_str(), argv, envp);
    const int error = errno;
    ssize_t ignored = ::write(status_pipe[1], &error, sizeof error);
    (void)ignored;
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so that the group exists before anyone signals it
  ::close(status_pipe[1]);
  int error = 0;
  ssize_t n;
  do {
    n = ::read(status_pipe[0], &error, sizeof error);
  } while (n < 0 && errno == EINTR);
  ::close(status_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof error)) {
    ::waitpid(pid, nullptr, 0);
    throw Error(std::string("launch: cannot start '") + argv[0] + "': " + std::strerror(error));
  }
  return pid;
}

std::string signal_name(int signal_number) {
  if (signal_number == SIGTERM) return "SIGTERM";
  if (signal_number == SIGINT) return "SIGINT";
  return "signal " + std::to_string(signal_number);
}

// "exited with code 3", "exited with signal 9 (SIGKILL)".
std::string how_it_ended(const Child& c) {
  if (c.term_signal == 0) return "exited with code " + std::to_string(c.exit_code);
  static const std::pair<int, const char*> names[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},   {SIGABRT, "SIGABRT"},
      {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},   {SIGKILL, "SIGKILL"}, {SIGSEGV, "SIGSEGV"}, {SIGPIPE, "SIGPIPE"},
      {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"}};
  std::string text = "exited with signal " + std::to_string(c.term_signal);
  for (const auto& [number, name] : names)
    if (number == c.term_signal) text += std::string(" (") + name + ")";
  return text;
}

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

// Whether the ranks train on the CPU as far as the launcher can tell: ptrain train's --device, its
// PTRAIN_DEVICE variable (which an accelerate file's use_cpu and MULTI_CPU set), or its --config file's device
// key, which the ranks read only where neither of the others is given.
bool trains_on_cpu(const LaunchOptions& o) {
  const char* device = std::getenv("PTRAIN_DEVICE");
  if (device != nullptr && starts_with(device, "cpu")) return true;
  const auto& command = o.command;
  for (size_t i = 0; i < command.size(); ++i) {
    if (starts_with(command[i], "--device=")) return starts_with(command[i].substr(9), "cpu");
    if (command[i] == "--device" && i + 1 < command.size()) return starts_with(command[i + 1], "cpu");
  }
  if (device != nullptr && *device != '\0') return false;
  return starts_with(o.config_device, "cpu");
}

std::string counted(int64_t n, const std::string& what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); }

void validate(const LaunchOptions& o) {
  check(!o.command.empty(), "launch: no command given (ptrain launch [options] -- program args...)");
  check(o.nproc_per_node >= 1, "launch: --nproc-per-node must be at least 1");
  check(o.nnodes >= 1, "launch: --nnodes must be at least 1");
  check(o.node_rank >= 0 && o.node_rank < o.nnodes, "launch: --node-rank " + std::to_string(o.node_rank) +
                                                         " is outside [0, --nnodes " + std::to_string(o.nnodes) + ")");
  check(o.master_port >= 0 && o.master_port < 65536, "launch: --master-port " + std::to_string(o.master_port) +
                                                          " is not a TCP port (1-65535)");
  check(!o.master_addr.empty(), "launch: --master-addr is empty");
  check(o.timeout_seconds >= 0, "launch: --timeout must not be negative");
  check(o.kill_grace_seconds >= 0, "launch: the kill grace period must not be negative");
  check(o.max_restarts >= 0, "launch: --max-restarts must not be negative");
  // Each node's launcher would restart its own ranks alone, and the other nodes' ranks would wait at a
  // rendezvous nobody hosts: restarting a job across nodes needs the launchers to agree, which they don't.
  check(o.max_restarts == 0 || o.nnodes == 1,
        "launch: --max-restarts " + std::to_string(o.max_restarts) + " restarts a job on one node only (this one has --nnodes " +
            std::to_string(o.nnodes) + "): leave --max-restarts out, or restart the job from its checkpoint by hand");
  if (o.allow_oversubscribe) return;
  const NodeCapacity capacity = node_capacity(o);
  check(o.nproc_per_node <= capacity.processes,
        "launch: " + o.nproc_source + " " + std::to_string(o.nproc_per_node) + " is more processes than this node's " +
            capacity.what + " (at most " + std::to_string(capacity.processes) +
            "): lower it, or pass --allow-oversubscribe to run them anyway");
}

constexpr int kMultiNodeMasterPort = 29500;  // torchrun's

std::string random_run_id() {
  std::random_device random;
  char text[17];
  std::snprintf(text, sizeof text, "%08x%08x", random(), random());
  return text;
}

// The port and run id the ranks meet under (see LaunchOptions), checked before any rank starts.
void settle_rendezvous(LaunchOptions& o) {
  if (o.master_port == 0) {
    o.master_port = o.nnodes == 1 ? free_tcp_port() : kMultiNodeMasterPort;
  } else if (o.node_rank == 0) {
    // Rank 0 would fail to host its store there, and the other ranks could join the store listening on it.
    check(!tcp_port_in_use(o.master_port),
          "launch: --master-port " + std::to_string(o.master_port) +
              " is in use on this host (another job's rendezvous, or another program): choose another port" +
              (o.nnodes == 1 ? ", or leave --master-port out to take a free one" : ""));
  }
  if (o.run_id.empty()) {
    const char* inherited = std::getenv("TORCHELASTIC_RUN_ID");
    if (inherited != nullptr && *inherited != '\0' && std::string(inherited) != "none") {
      o.run_id = inherited;
    } else if (o.nnodes == 1) {
      o.run_id = random_run_id();
    }
  }
}

// Variables every rank of this node gets besides its place in the job; notes what it chose for them.
Variables node_variables(const LaunchOptions& o) {
  Variables variables;
  if (!o.run_id.empty()) variables.emplace_back("TORCHELASTIC_RUN_ID", o.run_id);
  const char* omp = std::getenv("OMP_NUM_THREADS");
  if (o.nproc_per_node > 1 && (omp == nullptr || *omp == '\0')) {
    const unsigned cores = std::thread::hardware_concurrency();
    const int64_t threads = threads_per_process(o.nproc_per_node, cores);
    variables.emplace_back("OMP_NUM_THREADS", std::to_string(threads));
    write_all(o.stderr_fd, "ptrain launch: OMP_NUM_THREADS=" + std::to_string(threads) + " for each of the " +
                               std::to_string(o.nproc_per_node) + " processes (" + std::to_string(cores) +
                               " hardware threads shared); set OMP_NUM_THREADS or --threads to choose otherwise\n");
  }
  return variables;
}

}  // namespace

NodeCapacity node_capacity(const LaunchOptions& o) {
  if (!trains_on_cpu(o)) {
    const int64_t gpus = o.visible_gpus >= 0 ? o.visible_gpus : static_cast<int64_t>(torch::cuda::device_count());
    if (gpus > 0) return {gpus, counted(gpus, "visible GPU")};
  }
  const unsigned threads = o.hardware_threads > 0 ? o.hardware_threads : std::thread::hardware_concurrency();
  const int64_t cores = std::max<int64_t>(1, threads);
  return {cores, counted(cores, "core")};
}

namespace {

enum class Ending { completed, rank_failed, timed_out, signalled, signalled_while_starting };

// How one attempt of the job ended: the rank whose failure ended it (rank_failed), or the signal the
// launcher received.
struct Attempt {
  Ending ending = Ending::completed;
  Child failed;  // rank, pid, exit code and signal only: its readers are joined
  int signal_number = 0;
  int started = 0;
};

// Starts every rank of this node and waits for them, stopping them all when one fails, the job passes
// its deadline or the launcher receives SIGINT or SIGTERM. No rank outlives the call. Throws ptrain::Error
// when a rank cannot be started (those started are killed first).
Attempt run_attempt(const LaunchOptions& options, const Variables& node,
                    std::chrono::steady_clock::time_point job_start) {
  std::mutex output_mutex;
  std::vector<Child> children(static_cast<size_t>(options.nproc_per_node));
  auto join_readers = [&] {
    for (auto& c : children)
      for (auto& t : c.readers) t.join();
  };

  std::vector<char*> argv;
  for (const auto& arg : options.command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  const std::string program = find_program(options.command.front());

  Attempt attempt;
  // A signal during the start of many ranks must not wait for the last one to start: each start checks.
  for (int local = 0; local < options.nproc_per_node; ++local) {
    if (received_signal != 0) {
      attempt.ending = Ending::signalled_while_starting;
      attempt.signal_number = received_signal;
      break;
    }
    auto& c = children[static_cast<size_t>(local)];
    c.local_rank = local;
    c.rank = static_cast<int64_t>(options.node_rank) * options.nproc_per_node + local;
    int out_pipe[2], err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
      stop_all(children, 0, SIGKILL);
      join_readers();
      throw Error(std::string("launch: cannot create pipes: ") + std::strerror(errno));
    }
    const auto env_strings = child_environment(options, local, node);
    std::vector<char*> envp;
    for (const auto& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);

    try {
      c.pid = start_rank(program, argv.data(), envp.data(), out_pipe[1], err_pipe[1]);
    } catch (const Error&) {
      ::close(out_pipe[0]);
      ::close(err_pipe[0]);
      ::close(out_pipe[1]);
      ::close(err_pipe[1]);
      stop_all(children, 0, SIGKILL);
      join_readers();
      throw;
    }
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    c.running = true;
    const std::string prefix = "[rank " + std::to_string(c.rank) + "] ";
    c.readers.emplace_back(forward_lines, out_pipe[0], options.stdout_fd, prefix, std::ref(output_mutex));
    c.readers.emplace_back(forward_lines, err_pipe[0], options.stderr_fd, prefix, std::ref(output_mutex));
    ++attempt.started;
  }
  if (attempt.ending == Ending::signalled_while_starting) {
    stop_all(children, options.kill_grace_seconds, attempt.signal_number);
    join_readers();
    return attempt;
  }

  int failed = -1;
  while (any_running(children)) {
    failed = reap(children, false);
    if (failed >= 0) {
      attempt.ending = Ending::rank_failed;
      break;
    }
    if (received_signal != 0) {
      attempt.ending = Ending::signalled;
      attempt.signal_number = received_signal;
      break;
    }
    if (options.timeout_seconds > 0 &&
        std::chrono::steady_clock::now() - job_start > std::chrono::duration<double>(options.timeout_seconds)) {
      attempt.ending = Ending::timed_out;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (any_running(children))
    stop_all(children, options.kill_grace_seconds, attempt.signal_number != 0 ? attempt.signal_number : SIGTERM);
  // Background helpers a rank left behind would keep its output pipe open (and outlive the job).
  for (const auto& c : children)
    if (c.pid > 0) ::kill(-c.pid, SIGKILL);
  join_readers();
  if (attempt.ending == Ending::completed) {
    for (size_t i = 0; i < children.size() && failed < 0; ++i)
      if (children[i].exit_code != 0) failed = static_cast<int>(i);
    if (failed >= 0) attempt.ending = Ending::rank_failed;
  }
  if (failed >= 0) {
    const Child& c = children[static_cast<size_t>(failed)];
    attempt.failed.rank = c.rank;
    attempt.failed.pid = c.pid;
    attempt.failed.exit_code = c.exit_code;
    attempt.failed.term_signal = c.term_signal;
  }
  return attempt;
}

// The variables that tell the ranks which attempt of the job they are: torchrun's, and ptrain's with the
// causes (ptrain train resumes from the newest checkpoint on a restart and records the causes). None
// without --max-restarts, as before the flag existed.
Variables restart_variables(const LaunchOptions& o, const std::vector<std::string>& causes) {
  if (o.max_restarts == 0) return {};
  std::string joined;
  for (const auto& cause : causes) joined += (joined.empty() ? "" : "\n") + cause;
  const std::string count = std::to_string(causes.size());
  return {{"TORCHELASTIC_RESTART_COUNT", count},
          {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
          {"PTRAIN_RESTART_COUNT", count},
          {"PTRAIN_RESTART_CAUSES", joined}};
}

struct SignalForwarding {
  struct sigaction old_int {}, old_term {};
  SignalForwarding() {
    struct sigaction forward_action {};
    forward_action.sa_handler = remember_signal;
    sigemptyset(&forward_action.sa_mask);
    received_signal = 0;
    ::sigaction(SIGINT, &forward_action, &old_int);
    ::sigaction(SIGTERM, &forward_action, &old_term);
  }
  ~SignalForwarding() {
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGTERM, &old_term, nullptr);
  }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;
};

}  // namespace

int launch(const LaunchOptions& requested) {
  validate(requested);
  LaunchOptions options = requested;
  settle_rendezvous(options);
  const Variables node = node_variables(options);
  const SignalForwarding forwarding;
  const auto job_start = std::chrono::steady_clock::now();
  std::vector<std::string> causes;  // one a restart so far

  while (true) {
    Variables variables = node;
    const Variables restart = restart_variables(options, causes);
    variables.insert(variables.end(), restart.begin(), restart.end());
    const Attempt attempt = run_attempt(options, variables, job_start);

    if (attempt.ending == Ending::completed) return 0;
    if (attempt.ending == Ending::signalled_while_starting) {
      write_all(options.stderr_fd, "ptrain launch: received " + signal_name(attempt.signal_number) + " after starting " +
                                       std::to_string(attempt.started) + " of the " +
                                       std::to_string(options.nproc_per_node) +
                                       " ranks of this node: started no more and stopped those\n");
      return 128 + attempt.signal_number;
    }
    if (attempt.ending == Ending::timed_out) {
      write_all(options.stderr_fd, "ptrain launch: the job exceeded --timeout " + std::to_string(options.timeout_seconds) +
                                       " s; stopped every rank\n");
      return 1;
    }
    if (attempt.ending == Ending::signalled) {
      write_all(options.stderr_fd,
                "ptrain launch: received " + signal_name(attempt.signal_number) + "; forwarded it to every rank\n");
      return 128 + attempt.signal_number;
    }

    const Child& c = attempt.failed;
    const std::string cause = "rank " + std::to_string(c.rank) + " " + how_it_ended(c);
    std::string report = "ptrain launch: rank " + std::to_string(c.rank) + " (pid " + std::to_string(c.pid) +
                         ") exited with code " + std::to_string(c.exit_code) + "; stopped the other ranks";
    const std::string flag = " (--max-restarts " + std::to_string(options.max_restarts) + ")";
    if (options.max_restarts > 0) {
      if (usage_error(c)) {
        write_all(options.stderr_fd,
                  report + "; not restarting" + flag + ": code " + std::to_string(kUsageErrorExitCode) +
                      " is a usage error (ptrain's code for an error it named: a bad flag, config or input), which a "
                      "restart would meet again\n");
        return c.exit_code;
      }
      if (received_signal != 0) {
        // Told to stop while a rank failed: the job ends as one the launcher was told to stop.
        const int signal_number = received_signal;
        write_all(options.stderr_fd, report + "; not restarting: received " + signal_name(signal_number) + "\n");
        return 128 + signal_number;
      }
      if (static_cast<int>(causes.size()) >= options.max_restarts) {
        write_all(options.stderr_fd, report + "; gave up after " + std::to_string(causes.size()) + " restart" +
                                         (causes.size() == 1 ? "" : "s") + flag + "\n");
        return c.exit_code;
      }
      causes.push_back(cause);
      // The rendezvous port of the attempt before may linger in TIME_WAIT: a port the launcher chose is
      // chosen afresh; a given one is kept (and checked again).
      if (requested.master_port == 0) {
        options.master_port = free_tcp_port();
      } else {
        check(!tcp_port_in_use(options.master_port),
              "launch: --master-port " + std::to_string(options.master_port) +
                  " is in use on this host, so the job cannot restart on it: choose another port, or leave "
                  "--master-port out to take a free one at each restart");
      }
      write_all(options.stderr_fd, "ptrain launch: restart " + std::to_string(causes.size()) + " of " +
                                       std::to_string(options.max_restarts) + ": " + cause +
                                       "; stopped the other ranks, starting every rank again (ptrain train "
                                       "resumes from the newest checkpoint in its --checkpoint-dir)\n");
      continue;
    }
    write_all(options.stderr_fd, report + "\n");
    return c.exit_code;
  }
}

}  // namespace ptrain::distributed
