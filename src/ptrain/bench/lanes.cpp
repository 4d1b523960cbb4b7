#include "ptrain/bench/lanes.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "ptrain/core/error.h"

namespace ptrain::bench {

bool run_in_lanes(int64_t total_gpus, const std::vector<int64_t>& gpus_needed,
                  const std::function<bool(size_t, const std::vector<int64_t>&)>& task) {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<int64_t> free_gpus;
  for (int64_t g = 0; g < total_gpus; ++g) free_gpus.push_back(g);
  int running = 0;
  bool stop = false;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < gpus_needed.size(); ++i) {
    const int64_t needs = gpus_needed[i];
    const bool alone = needs <= 0 || needs > total_gpus;
    std::vector<int64_t> assigned;
    {
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait(lock, [&] {
        return stop || (alone ? running == 0 : static_cast<int64_t>(free_gpus.size()) >= needs);
      });
      if (stop) break;
      if (!alone) {
        assigned.assign(free_gpus.begin(), free_gpus.begin() + needs);
        free_gpus.erase(free_gpus.begin(), free_gpus.begin() + needs);
      }
      ++running;
    }
    const auto body = [&, i, assigned] {
      const bool go_on = task(i, assigned);
      std::lock_guard<std::mutex> lock(mutex);
      free_gpus.insert(free_gpus.end(), assigned.begin(), assigned.end());
      std::sort(free_gpus.begin(), free_gpus.end());
      --running;
      stop = stop || !go_on;
      changed.notify_all();
    };
    if (alone) {
      body();  // nothing else runs meanwhile: no thread needed
    } else {
      threads.emplace_back(body);
    }
  }
  for (auto& t : threads) t.join();
  return !stop;
}

}  // namespace ptrain::bench
