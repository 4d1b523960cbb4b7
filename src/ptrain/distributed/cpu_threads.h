// How many intra-op CPU threads each process of a job uses. Processes sharing a node share its cores:
// one process per core-group keeps them from oversubscribing the node (two ranks on two cores, each with
// two threads, train thirty times slower than with one).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>

namespace ptrain::distributed {

// The cores divided among the processes of one node, at least 1.
int64_t threads_per_process(int64_t processes_on_node, unsigned hardware_threads);

// requested (--threads) when positive; else OMP_NUM_THREADS when set (as torchrun and OpenMP read it);
// else threads_per_process. Throws ptrain::Error naming OMP_NUM_THREADS when it is not a positive integer.
int64_t intra_op_threads(int64_t requested, int64_t processes_on_node, unsigned hardware_threads,
                         const std::function<const char*(const char*)>& getenv = ::getenv);

// The warning for processes whose threads together exceed the node's cores (each step of each process
// then waits for the others' threads), "" when they do not or the process is alone on its node. source:
// what chose threads ("--threads 8", "OMP_NUM_THREADS=8").
std::string oversubscription_warning(int64_t threads, const std::string& source, int64_t processes_on_node,
                                     unsigned hardware_threads);

}  // namespace ptrain::distributed
