// Large byte spans (a checkpoint's tensors) cut into chunks and handled on several threads: one thread reads or
// writes memory at a few GB/s, seconds of a ten-gigabyte checkpoint, while the cores are free. The checksum of a
// file (safetensors.cpp) and its write (atomic_file.cpp) share this.
#pragma once

#include <cstddef>
#include <functional>
#include <string_view>
#include <vector>

namespace ptrain::io {

inline constexpr size_t kChunkBytes = size_t{64} << 20;

// The spans one after another, cut into chunks of at most kChunkBytes, in order.
std::vector<std::string_view> chunks_of(const std::vector<std::string_view>& spans);

// work(i) for every i in [0, count), on up to max_threads threads (the caller's among them), each taking the next
// index. The first exception stops the others at their next index and is rethrown here once all have stopped.
void for_each_index_in_parallel(size_t count, size_t max_threads, const std::function<void(size_t)>& work);

}  // namespace ptrain::io
