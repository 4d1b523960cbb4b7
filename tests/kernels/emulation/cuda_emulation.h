// Runs the source of ptrain's CUDA kernels on the CPU, one host thread per CUDA thread, so that kernels written on a
// machine without a GPU are checked against LibTorch before a device call. emulate_source.py rewrites each launch,
// kernel<<<grid, block, shared, stream>>>(args), into ptrain_emulation::launch(grid, block, [&] { kernel(args); }),
// each __shared__ declaration into storage of the running block's, and drops what only nvcc reads (the
// cooperative-groups header, inline PTX); this header supplies the rest: threadIdx and the other built-ins
// (thread-local, set per thread), __syncthreads and __shfl_xor_sync (barriers over the block and the warp, which a
// thread that returns leaves, as an exited thread stops counting on a GPU), cooperative launches (every block at
// once) and their grid-wide sync, __ldg and __ldcg, and the runtime calls the launchers make
// (cuda_emulation_runtime.cpp: kEmulatedMultiprocessors multiprocessors, each holding one block of any kernel).
// Shared memory starts as all-ones bytes (a NaN in fp32), so that reading what no thread wrote shows.
//
// What this checks: indexing, coverage of the rows and columns, the order of the reductions, arithmetic. What it
// cannot: the GPU's memory model, alignment faults, occupancy, speed, or a race that real warps would expose.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <typeindex>
#include <utility>
#include <vector>

// CUDA's built-ins, set for each thread as it starts (globals, as nvcc's are: a launcher's config.gridDim stays a member).
inline thread_local uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;

namespace ptrain_emulation {

// A barrier whose party shrinks as threads leave (a returned thread no longer takes part).
class Barrier {
 public:
  explicit Barrier(int parties) : parties_(parties) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = generation_;
    if (++waiting_ == parties_) {
      release();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation; });
  }
  void leave() {
    std::lock_guard<std::mutex> lock(mutex_);
    --parties_;
    if (waiting_ > 0 && waiting_ == parties_) release();
  }

 private:
  void release() {
    waiting_ = 0;
    ++generation_;
    cv_.notify_all();
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  int parties_;
  int waiting_ = 0;
  uint64_t generation_ = 0;
};

constexpr int kEmulatedMultiprocessors = 2;

struct Block {
  explicit Block(int threads) : block(threads), exchange(static_cast<size_t>(threads)) {
    for (int w = 0; w < (threads + 31) / 32; ++w) warps.push_back(std::make_unique<Barrier>(std::min(32, threads - 32 * w)));
  }
  Barrier block;
  std::vector<std::unique_ptr<Barrier>> warps;
  std::vector<uint64_t> exchange;  // one slot a thread, for the warp shuffles
  std::mutex shared_mutex;
  std::map<std::pair<std::string, std::type_index>, std::unique_ptr<unsigned char[]>> shared;
};

inline thread_local Block* current_block = nullptr;
inline thread_local Barrier* current_grid = nullptr;  // a cooperative launch's every thread

// The running block's copy of a __shared__ declaration (named by where it stands in its source), made on first use.
template <typename T>
T& block_shared(const char* where) {
  std::lock_guard<std::mutex> lock(current_block->shared_mutex);
  auto& slot = current_block->shared[{where, std::type_index(typeid(T))}];
  if (!slot) {
    slot.reset(new unsigned char[sizeof(T)]);
    std::memset(slot.get(), 0xFF, sizeof(T));
  }
  return *reinterpret_cast<T*>(slot.get());
}

inline int linear_thread() {
  return static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

inline void syncthreads() { current_block->block.wait(); }

template <typename T>
T shfl_xor(T v, int lane_mask) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "a warp shuffle moves 4 or 8 bytes");
  const int t = linear_thread(), warp = t / 32;
  Barrier& barrier = *current_block->warps[static_cast<size_t>(warp)];
  std::memcpy(&current_block->exchange[static_cast<size_t>(t)], &v, sizeof(T));
  barrier.wait();
  T other;
  std::memcpy(&other, &current_block->exchange[static_cast<size_t>(warp * 32 + ((t % 32) ^ lane_mask))], sizeof(T));
  barrier.wait();
  return other;
}

// What a launch's threads share: its shape and its blocks' state.
struct Launch {
  Launch(dim3 grid_in, dim3 block_in)
      : grid(grid_in), block(block_in), threads(static_cast<int>(block_in.x * block_in.y * block_in.z)),
        blocks(static_cast<size_t>(grid_in.x) * grid_in.y * grid_in.z) {
    for (size_t b = 0; b < blocks; ++b) states.push_back(std::make_unique<Block>(threads));
  }
  // Sets the built-ins for thread t of block b and runs body; the thread then leaves its block's barriers.
  template <typename Body>
  void run(size_t b, int t, Body& body) {
    threadIdx = {static_cast<unsigned>(t) % block.x, static_cast<unsigned>(t) / block.x % block.y,
                 static_cast<unsigned>(t) / (block.x * block.y)};
    blockIdx = {static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                static_cast<unsigned>(b / (static_cast<size_t>(grid.x) * grid.y))};
    blockDim = block;
    gridDim = grid;
    current_block = states[b].get();
    body();
    current_block->block.leave();
    current_block->warps[static_cast<size_t>(t / 32)]->leave();
  }
  dim3 grid, block;
  int threads;
  size_t blocks;
  std::vector<std::unique_ptr<Block>> states;
};

// Runs body once for every thread of every block: a block's threads at once, blocks one after another. One host
// thread per CUDA thread of a block, reused for every block.
template <typename Body>
void launch(dim3 grid, dim3 block, Body&& body) {
  Launch l(grid, block);
  Barrier between_blocks(l.threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < l.threads; ++t) {
    pool.emplace_back([&, t] {
      for (size_t b = 0; b < l.blocks; ++b) {
        l.run(b, t, body);
        between_blocks.wait();
      }
    });
  }
  for (auto& th : pool) th.join();
}

// A cooperative launch: every thread of every block at once, so that the grid-wide sync can meet.
template <typename Body>
void launch_cooperative(dim3 grid, dim3 block, Body&& body) {
  Launch l(grid, block);
  Barrier whole_grid(static_cast<int>(l.blocks) * l.threads);
  std::vector<std::thread> pool;
  for (size_t b = 0; b < l.blocks; ++b) {
    for (int t = 0; t < l.threads; ++t) {
      pool.emplace_back([&, b, t] {
        current_grid = &whole_grid;
        l.run(b, t, body);
        whole_grid.leave();
      });
    }
  }
  for (auto& th : pool) th.join();
}

template <typename T>
T load_global(const T* p) {
  return *p;
}

}  // namespace ptrain_emulation

namespace cooperative_groups {
struct grid_group {
  void sync() const { ::ptrain_emulation::current_grid->wait(); }
};
inline grid_group this_grid() { return {}; }
}  // namespace cooperative_groups

// The runtime's C++ launch of a typed kernel, as batch_norm.cu's cooperative launches call it: run as cooperative
// when the config says so, else block after block.
template <typename... Params, typename... Args>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* config, void (*kernel)(Params...), Args&&... args) {
  bool cooperative = false;
  for (unsigned i = 0; i < config->numAttrs; ++i)
    if (config->attrs[i].id == cudaLaunchAttributeCooperative && config->attrs[i].val.cooperative) cooperative = true;
  auto body = [&] { kernel(static_cast<Params>(args)...); };
  if (cooperative) {
    ::ptrain_emulation::launch_cooperative(config->gridDim, config->blockDim, body);
  } else {
    ::ptrain_emulation::launch(config->gridDim, config->blockDim, body);
  }
  return cudaSuccess;
}

// Every kernel: one block a multiprocessor.
template <typename Kernel>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel*, int, size_t) {
  *blocks = 1;
  return cudaSuccess;
}

#define __launch_bounds__(...)
#define __syncthreads() ::ptrain_emulation::syncthreads()
#define __shfl_xor_sync(mask, value, lane_mask) ::ptrain_emulation::shfl_xor((value), (lane_mask))
#define cudaGetLastError() cudaSuccess
#define __ldg(p) ::ptrain_emulation::load_global(p)
#define __ldcg(p) ::ptrain_emulation::load_global(p)

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
// One lock for every address: the amax kernels' one atomic a block is all that calls it.
inline unsigned int atomicMax(unsigned int* address, unsigned int value) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  const unsigned int old = *address;
  if (value > old) *address = value;
  return old;
}
// CUDA's min and max take two integers of either width, as std::min and std::max do not.
template <typename A, typename B>
inline std::common_type_t<A, B> min(A a, B b) { return b < a ? b : a; }
template <typename A, typename B>
inline std::common_type_t<A, B> max(A a, B b) { return a < b ? b : a; }
using std::isnan;
