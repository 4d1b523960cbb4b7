// `ptrain launch`: starts one process per local rank with the torchrun environment (RANK, LOCAL_RANK,
// WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GROUP_RANK), prefixes their output lines with
// "[rank N] ", forwards SIGINT/SIGTERM, and stops the whole job when one rank fails. Each rank leads a
// process group of its own and is killed by the kernel if the launcher dies (even by kill -9).
#pragma once

#include <string>
#include <unistd.h>
#include <vector>

namespace ptrain::dist {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::vector<std::string> command;  // program (looked up in PATH) and its arguments
  // Wall-clock limit for the whole job; 0 = none. Past it every rank is stopped and launch fails.
  double timeout_seconds = 0;
  // Between SIGTERM and SIGKILL when ranks are stopped.
  double kill_grace_seconds = 5;
  // Where the prefixed lines go (tests redirect them).
  int stdout_fd = STDOUT_FILENO;
  int stderr_fd = STDERR_FILENO;
};

// Returns 0 when every rank exited 0. Otherwise stops the remaining ranks (SIGTERM, then SIGKILL after
// the grace period, each rank's whole process group), reports the first failed rank on stderr_fd and
// returns its exit code (128 + signal when it was killed, 1 for a timeout), never 0. No child outlives
// the call. Throws ptrain::Error for invalid options or a command that cannot be started.
int launch(const LaunchOptions& options);

}  // namespace ptrain::dist
