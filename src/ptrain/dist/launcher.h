// `ptrain launch`: starts one process per local rank with the torchrun environment (RANK, LOCAL_RANK,
// WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GROUP_RANK, TORCHELASTIC_RUN_ID; OMP_NUM_THREADS,
// when unset, as the node's cores divided among its processes), prefixes their output lines with
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
  // 0: a free port on a single node (the kernel's pick, as torchrun --standalone), 29500 across nodes.
  // On node 0 a port another socket listens on is refused before any rank starts.
  int master_port = 0;
  // Names the job at its rendezvous, so that no rank joins another job's store (TORCHELASTIC_RUN_ID in
  // the ranks' environment). Empty: TORCHELASTIC_RUN_ID of the launcher's environment, else a random id
  // on a single node and none across nodes (where each node's launcher would pick another).
  std::string run_id;
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
