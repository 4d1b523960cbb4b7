// Where this process sits in a multi-process job, read from whichever launcher started it.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace ptrain::distributed {

struct LaunchEnvironment {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  int64_t local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single";  // "torchrun" (also ptrain launch), "slurm", "openmpi", "single"
  // Names this job among others that might share MASTER_ADDR:MASTER_PORT (TORCHELASTIC_RUN_ID, which
  // ptrain launch sets; Slurm's job and step ids); empty when the launcher gave none.
  std::string run_id;
};

// Whether `ptrain launch --max-restarts` restarted this job after a rank failed (PTRAIN_RESTART_COUNT, and
// TORCHELASTIC_RESTART_COUNT beside it as torchrun exports it), and why: PTRAIN_RESTART_CAUSES holds one line
// per restart, oldest first ("rank 1 exited with signal 9 (SIGKILL)"). count 0: the job's first attempt, or
// a launcher that does not restart. Throws ptrain::Error naming the variable when the count is not a
// non-negative integer.
struct RestartInfo {
  int64_t count = 0;
  std::vector<std::string> causes;
};
RestartInfo detect_restart(const std::function<const char*(const char*)>& getenv = ::getenv);

// Precedence torchrun > slurm > openmpi > single process: torchrun and ptrain launch set RANK inside a
// Slurm or MPI allocation, and their values describe the processes actually started. Throws
// ptrain::Error naming the variable when a value is not a number or contradicts the others.
LaunchEnvironment detect_environment(const std::function<const char*(const char*)>& getenv = ::getenv);

// The variables that placed this process, as a user would look for them: "RANK=1 and WORLD_SIZE=2 (torchrun
// or ptrain launch)", "SLURM_PROCID=0 and SLURM_NTASKS=4 (Slurm)"; "" for a single process.
std::string rank_variables(const LaunchEnvironment& env);

// The first host of a Slurm node list such as "node[01-04,07],gpu5" (here "node01").
std::string first_slurm_host(const std::string& nodelist);

// Tasks on node `node_index` from SLURM_TASKS_PER_NODE such as "4(x2),3".
int64_t slurm_tasks_on_node(const std::string& tasks_per_node, int64_t node_index);

}  // namespace ptrain::distributed
