// `ptrain launch`: starts one process per local rank with the torchrun environment (RANK, LOCAL_RANK,
// WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GROUP_RANK, TORCHELASTIC_RUN_ID; OMP_NUM_THREADS,
// when unset, as the node's cores divided among its processes), prefixes their output lines with
// "[rank N] ", forwards SIGINT/SIGTERM (also while it is still starting ranks: it starts no more), and stops
// the whole job when one rank fails. Each rank leads a process group of its own and is killed by the kernel
// if the launcher dies (even by kill -9). A node runs at most one process a visible GPU (a job that trains
// on GPUs) or a core (otherwise) unless oversubscription is allowed.
#pragma once

#include <cstdint>
#include <string>
#include <unistd.h>
#include <vector>

namespace ptrain::distributed {

// ptrain's exit code for an error it named (a bad flag, config or input: the README's "Exit codes"), as
// argparse's for a bad argument: a restart would meet it again, so --max-restarts does not retry it.
constexpr int kUsageErrorExitCode = 2;

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
  // --max-restarts: when a rank fails, every rank is stopped and the job started again, at most this many
  // times (torchrun's flag), on a fresh rendezvous port unless master_port was given. The ranks learn which
  // attempt they are from TORCHELASTIC_RESTART_COUNT, PTRAIN_RESTART_COUNT and PTRAIN_RESTART_CAUSES (one
  // line a restart: "rank 1 exited with signal 9 (SIGKILL)"); ptrain train resumes from the newest
  // checkpoint of its --checkpoint-dir. A rank exiting with kUsageErrorExitCode is not retried, nor is a
  // job past its timeout or one the launcher was told to stop (SIGINT, SIGTERM). One node only.
  int max_restarts = 0;
  // Between SIGTERM and SIGKILL when ranks are stopped.
  double kill_grace_seconds = 5;
  // Where the prefixed lines go (tests redirect them).
  int stdout_fd = STDOUT_FILENO;
  int stderr_fd = STDERR_FILENO;
  // --allow-oversubscribe: more processes on this node than node_capacity allows.
  bool allow_oversubscribe = false;
  // What set nproc_per_node, as the refusal names it: the flag, or an accelerate file's key.
  std::string nproc_source = "--nproc-per-node";
  // The node as node_capacity sees it; tests set them. 0 hardware threads: this machine's; -1 GPUs: count
  // the visible ones (asked only of a job that does not train on the CPU).
  unsigned hardware_threads = 0;
  int64_t visible_gpus = -1;
  // The `device` of the YAML file the command's --config names, as the CLI read it (config::
  // device_in_train_config); "" for none. A --device in the command or PTRAIN_DEVICE wins over it, as in the
  // ranks.
  std::string config_device;
};

// The most processes this node runs without allow_oversubscribe, and what bounds them ("2 cores", "8
// visible GPUs"). A job trains on GPUs when one is visible and neither the command (--device cpu) nor
// PTRAIN_DEVICE (what an accelerate file's use_cpu or MULTI_CPU sets) nor its --config file's device key puts
// it on the CPU; its processes beyond the GPUs would share them. Otherwise the cores bound it: thousands of processes on a few cores
// only thrash (and a mistyped count would fork until the machine runs out of processes).
struct NodeCapacity {
  int64_t processes = 1;
  std::string what;
};
NodeCapacity node_capacity(const LaunchOptions& options);

// Returns 0 when every rank exited 0. Otherwise stops the remaining ranks (SIGTERM, then SIGKILL after
// the grace period, each rank's whole process group), reports the first failed rank on stderr_fd and,
// unless max_restarts allows another attempt (reported on stderr_fd too), returns its exit code (128 +
// signal when it was killed, 1 for a timeout), never 0. No child outlives
// the call. A SIGINT or SIGTERM while ranks are still being started starts no more: the ones started are
// stopped and 128 + the signal is returned. Throws ptrain::Error for invalid options (among them more
// processes than node_capacity, naming nproc_source and the bound) or a command that cannot be started.
int launch(const LaunchOptions& options);

}  // namespace ptrain::distributed
