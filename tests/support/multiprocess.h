// Runs a test body in several forked processes, one per rank, talking gloo over loopback. The parent
// does no LibTorch work before forking, so the children start from a clean thread state.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ptrain/distributed/launch_environment.h"
#include "ptrain/distributed/ports.h"
#include "ptrain/distributed/process_group.h"
#include "scratch_dirs.h"

// The CPU process groups of these tests need gloo; a build against a LibTorch without gloo's headers
// (PyTorch's wheels, on the GPU machine) skips them instead of failing each one.
#define PTRAIN_SKIP_WITHOUT_GLOO()                                    \
  if (!::ptrain::distributed::ProcessGroup::backend_available("gloo"))        \
  GTEST_SKIP() << "this LibTorch has no gloo headers: no CPU process groups"

namespace ptrain::testing {

// A port for a test's store that nobody listens on now, below the kernel's ephemeral range. A port the
// kernel picks for an ephemeral bind is free only until the next ephemeral socket: under ctest -j another
// test's gloo connections took one between this call and the store's bind ("Address already in use"), and
// ephemeral sockets never take a port below the range. Tests running at once start their search at places
// drawn at random, so two rarely meet, and a port that does not bind now is skipped.
inline int free_port() {
  int ephemeral_low = 32768;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  if (range) range >> ephemeral_low;
  const int first = 10000, span = std::max(1000, ephemeral_low - first);
  static std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(::getpid()));
  for (int attempt = 0; attempt < 500; ++attempt) {
    const int port = first + static_cast<int>(rng() % static_cast<unsigned>(span));
    if (!distributed::tcp_port_in_use(port)) return port;
  }
  throw std::runtime_error("free_port: no port below " + std::to_string(ephemeral_low) + " binds");
}

inline distributed::LaunchEnvironment loopback(int64_t rank, int64_t world, int port) {
  distributed::LaunchEnvironment env;
  env.rank = rank;
  env.world_size = world;
  env.local_rank = rank;
  env.local_world_size = world;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  env.source = "test";
  return env;
}

// The variables torchrun gives rank `rank` of `world` on one node with its store at 127.0.0.1:port, for a
// forked rank that makes its Plan from the environment as a launched process does.
inline void set_launch_environment(int rank, int world, int port) {
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct RankOutcome {
  int exit_code = -1;     // -1: still running at the deadline (then killed)
  std::string message;    // what the body threw, if anything
};

// Forks one process per rank in `ranks` and runs body(rank) there; a throw becomes exit code 1 with
// its message recorded. Children still running after timeout_s are killed.
inline std::vector<RankOutcome> run_ranks(const std::vector<int>& ranks, const std::function<void(int)>& body,
                                          double timeout_s) {
  const std::string dir = temp_dir("ranks");
  std::vector<pid_t> pids;
  for (int rank : ranks) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 0;
      try {
        body(rank);
      } catch (const std::exception& e) {
        std::ofstream(dir + "/error" + std::to_string(rank)) << e.what();
        code = 1;
      } catch (...) {
        code = 2;
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<RankOutcome> outcomes(ranks.size());
  std::vector<bool> done(ranks.size(), false);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  size_t remaining = ranks.size();
  while (remaining > 0 && std::chrono::steady_clock::now() < deadline) {
    for (size_t i = 0; i < pids.size(); ++i) {
      int status = 0;
      if (!done[i] && ::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        done[i] = true;
        --remaining;
        outcomes[i].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (!done[i]) {
      ::kill(pids[i], SIGKILL);
      ::waitpid(pids[i], nullptr, 0);
    }
    outcomes[i].message = read_text(dir + "/error" + std::to_string(ranks[i]));
  }
  return outcomes;
}

inline std::vector<RankOutcome> run_world(int world, const std::function<void(int)>& body, double timeout_s) {
  std::vector<int> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(r);
  return run_ranks(ranks, body, timeout_s);
}

}  // namespace ptrain::testing
