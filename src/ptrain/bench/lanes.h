// Runs tasks in their order on a machine's GPUs: task i starts as soon as the GPUs it asks for are free
// (so one-GPU runs on a two-GPU machine go two at a time) and gets their indices. A task asking for no
// GPU, or for more than there are free, waits until nothing else runs (CPU runs, and runs that must be
// alone to be measured cleanly). Order is kept: a later task never overtakes one that waits.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace ptrain::bench {

// task(i, gpus) returns false to stop: tasks not yet started are skipped, running ones finish. Returns
// whether every task ran. Exceptions from a task are the task's to handle (it runs on its own thread).
bool run_in_lanes(int64_t total_gpus, const std::vector<int64_t>& gpus_needed,
                  const std::function<bool(size_t, const std::vector<int64_t>&)>& task);

}  // namespace ptrain::bench
