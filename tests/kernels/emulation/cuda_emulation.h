// Runs the source of ptrain's CUDA kernels on the CPU, one host thread per CUDA thread, so that kernels written on a
// machine without a GPU are checked against LibTorch before a device call. emulate_source.py rewrites each launch,
// kernel<<<grid, block, shared, stream>>>(args), into ptrain_emulation::launch(grid, block, [&] { kernel(args); });
// this header supplies what nvcc would: threadIdx and the other built-ins (thread-local, set per thread),
// __syncthreads and __shfl_xor_sync (barriers over the block and the warp, which a thread that returns leaves, as an
// exited thread stops counting on a GPU), __shared__ (one array a kernel instance: blocks run one after another),
// rsqrtf, and a launch check that always succeeds.
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
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

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

struct Block {
  explicit Block(int threads) : block(threads), exchange(static_cast<size_t>(threads)) {
    for (int w = 0; w < (threads + 31) / 32; ++w) warps.push_back(std::make_unique<Barrier>(std::min(32, threads - 32 * w)));
  }
  Barrier block;
  std::vector<std::unique_ptr<Barrier>> warps;
  std::vector<float> exchange;  // one slot a thread, for the warp shuffles
};

inline thread_local uint3 thread_idx, block_idx;
inline thread_local dim3 block_dim, grid_dim;
inline thread_local Block* current_block = nullptr;

inline int linear_thread() {
  return static_cast<int>(thread_idx.x + block_dim.x * (thread_idx.y + block_dim.y * thread_idx.z));
}

inline void syncthreads() { current_block->block.wait(); }

inline float shfl_xor(float v, int lane_mask) {
  const int t = linear_thread(), warp = t / 32;
  Barrier& barrier = *current_block->warps[static_cast<size_t>(warp)];
  current_block->exchange[static_cast<size_t>(t)] = v;
  barrier.wait();
  const float other = current_block->exchange[static_cast<size_t>(warp * 32 + ((t % 32) ^ lane_mask))];
  barrier.wait();
  return other;
}

// Runs body once for every thread of every block: a block's threads at once, blocks one after another (so that a
// kernel's __shared__ arrays, one for the whole launch here, serve one block at a time). One host thread per CUDA
// thread of a block, reused for every block.
template <typename Body>
void launch(dim3 grid, dim3 block, Body&& body) {
  const int threads = static_cast<int>(block.x * block.y * block.z);
  const size_t blocks = static_cast<size_t>(grid.x) * grid.y * grid.z;
  std::vector<std::unique_ptr<Block>> states;
  for (size_t b = 0; b < blocks; ++b) states.push_back(std::make_unique<Block>(threads));
  Barrier between_blocks(threads);
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      thread_idx = {static_cast<unsigned>(t) % block.x, static_cast<unsigned>(t) / block.x % block.y,
                    static_cast<unsigned>(t) / (block.x * block.y)};
      block_dim = block;
      grid_dim = grid;
      for (size_t b = 0; b < blocks; ++b) {
        block_idx = {static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                     static_cast<unsigned>(b / (static_cast<size_t>(grid.x) * grid.y))};
        current_block = states[b].get();
        body();
        current_block->block.leave();
        current_block->warps[static_cast<size_t>(t / 32)]->leave();
        between_blocks.wait();
      }
    });
  }
  for (auto& th : pool) th.join();
}

}  // namespace ptrain_emulation

#define threadIdx ::ptrain_emulation::thread_idx
#define blockIdx ::ptrain_emulation::block_idx
#define blockDim ::ptrain_emulation::block_dim
#define gridDim ::ptrain_emulation::grid_dim
#undef __shared__
#define __shared__ static
#define __launch_bounds__(...)
#define __syncthreads() ::ptrain_emulation::syncthreads()
#define __shfl_xor_sync(mask, value, lane_mask) ::ptrain_emulation::shfl_xor((value), (lane_mask))
#define cudaGetLastError() cudaSuccess

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
using std::isnan;
