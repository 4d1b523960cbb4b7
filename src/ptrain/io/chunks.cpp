#include "ptrain/io/chunks.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

namespace ptrain::io {

std::vector<std::string_view> chunks_of(const std::vector<std::string_view>& spans) {
  std::vector<std::string_view> chunks;
  for (const auto span : spans)
    for (size_t at = 0; at < span.size(); at += kChunkBytes) chunks.push_back(span.substr(at, kChunkBytes));
  return chunks;
}

void for_each_index_in_parallel(size_t count, size_t max_threads, const std::function<void(size_t)>& work) {
  const size_t threads = std::min(count, std::max<size_t>(max_threads, 1));
  std::atomic<size_t> next{0};
  std::mutex failure_mutex;
  std::exception_ptr failure;
  const auto take_indices = [&] {
    try {
      for (size_t i; (i = next.fetch_add(1)) < count;) work(i);
    } catch (...) {
      next = count;  // the others stop at their next index
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(take_indices);
  take_indices();
  for (auto& thread : pool) thread.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace ptrain::io
