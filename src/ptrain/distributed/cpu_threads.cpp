#include "ptrain/distributed/cpu_threads.h"

#include <algorithm>
#include <cerrno>
#include <string>

#include "ptrain/core/error.h"

namespace ptrain::distributed {

int64_t threads_per_process(int64_t processes_on_node, unsigned hardware_threads) {
  const int64_t cores = std::max<int64_t>(1, hardware_threads);
  return std::max<int64_t>(1, cores / std::max<int64_t>(1, processes_on_node));
}

int64_t intra_op_threads(int64_t requested, int64_t processes_on_node, unsigned hardware_threads,
                         const std::function<const char*(const char*)>& getenv) {
  if (requested > 0) return requested;
  const char* omp = getenv("OMP_NUM_THREADS");
  if (omp == nullptr || *omp == '\0') return threads_per_process(processes_on_node, hardware_threads);
  // OpenMP allows a list, one count per nesting level ("4,2"); the first is the one intra-op work uses.
  const std::string text(omp);
  const std::string first = text.substr(0, text.find(','));
  errno = 0;
  char* end = nullptr;
  const long long threads = std::strtoll(first.c_str(), &end, 10);
  check(!first.empty() && end == first.c_str() + first.size() && errno != ERANGE && threads > 0,
        "environment: OMP_NUM_THREADS='" + text +
            "' is not a positive number of threads (set a number, unset it, or pass --threads)");
  return threads;
}

std::string oversubscription_warning(int64_t threads, const std::string& source, int64_t processes_on_node,
                                     unsigned hardware_threads) {
  const int64_t cores = std::max<int64_t>(1, hardware_threads);
  if (processes_on_node <= 1 || threads * processes_on_node <= cores) return "";
  return source + " x " + std::to_string(processes_on_node) + " processes on this node = " +
         std::to_string(threads * processes_on_node) + " threads on " + std::to_string(cores) +
         " cores: the processes oversubscribe the cores and every step slows; " +
         std::to_string(threads_per_process(processes_on_node, hardware_threads)) +
         " thread(s) each fit (leave --threads and OMP_NUM_THREADS unset to get that share)";
}

}  // namespace ptrain::distributed
