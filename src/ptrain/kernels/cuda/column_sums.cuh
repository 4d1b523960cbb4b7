// Column sums of row-major [rows, cols] tensors (cols a multiple of 8, rows 16-byte aligned): what a linear
// layer's bias gradient and a layer norm's weight and bias gradients are. LibTorch's reduction over the outer
// dimension ran at about a third of the memory bandwidth on these shapes (GPT-2 large's bias gradients: 4.0 ms a
// step on an H200, where reading them once takes 1.4 ms), and the layer norm's own column kernel, with 256
// blocks and a thread's rows one after another, no better.
//
// Here a thread sums 8 adjacent columns (one 16-byte load in fp16/bf16, two in fp32) over every 8th row of a
// chunk; a block is 32 such threads across the row (a warp reads 512 contiguous bytes or more) by 8 row lanes,
// and one chunk of rows. Each block writes its chunk's fp32 sums; a second kernel adds the chunks. Both add in
// an order fixed by the shape alone, so the sums are the same from run to run and on any GPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "ptrain/kernels/cuda/elements.cuh"

namespace ptrain::kernels::cuda::column_sums {

constexpr int kColumns = 8;       // a thread's adjacent columns
constexpr int kTileThreads = 32;  // threads across a row: one warp
constexpr int kRowLanes = 8;      // warps a block, each every 8th row of the chunk
constexpr int kTileColumns = kColumns * kTileThreads;
constexpr int kBlock = kTileThreads * kRowLanes;
static_assert(kBlock == kTileColumns, "the block's threads add the row lanes' sums a column each");
constexpr int64_t kMinChunkRows = 64;
constexpr int64_t kMaxChunks = 65535;  // gridDim.y

// Rows a block sums: 64, or more where 65535 chunks of 64 would not cover the rows; a multiple of kRowLanes.
inline int64_t chunk_rows(int64_t rows) {
  const int64_t needed = (rows + kMaxChunks - 1) / kMaxChunks;
  const int64_t r = std::max(kMinChunkRows, needed);
  return (r + kRowLanes - 1) / kRowLanes * kRowLanes;
}
inline int64_t chunks(int64_t rows) { return (rows + chunk_rows(rows) - 1) / chunk_rows(rows); }
// The fp32 workspace of one sum: each chunk's sums.
inline int64_t workspace_floats(int64_t rows, int64_t cols) { return chunks(rows) * cols; }

inline void check_shape(const char* what, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0 || cols % kColumns != 0)
    throw std::runtime_error(std::string(what) + ": cols must be a positive multiple of 8 and rows positive, got [" +
                             std::to_string(rows) + ", " + std::to_string(cols) + "]");
}

// 8 adjacent elements as fp32, and back (rounded to nearest even).
template <typename T>
__device__ __forceinline__ void load8(const T* p, float* out) {
  constexpr int kVec = Vec<T>::kSize;
#pragma unroll
  for (int i = 0; i < kColumns / kVec; ++i) to_floats(*reinterpret_cast<const Vec<T>*>(p + i * kVec), out + i * kVec);
}

template <typename T>
__device__ __forceinline__ void store8(T* p, const float* in) {
  constexpr int kVec = Vec<T>::kSize;
#pragma unroll
  for (int i = 0; i < kColumns / kVec; ++i) *reinterpret_cast<Vec<T>*>(p + i * kVec) = from_floats<T>(in + i * kVec);
}

// Op adds row `row`'s columns [col, col + 8) to acc[s][0..8) for each of its kSums sums (and may write what it
// computed on the way): __device__ void operator()(int64_t row, int64_t col, float (&acc)[kSums][kColumns]) const.
// partials: kSums blocks of [chunks, cols].
template <int kSums, typename Op>
__global__ void __launch_bounds__(kBlock) chunk_sums_kernel(Op op, int64_t rows, int64_t cols, int64_t rows_per_chunk,
                                                            float* __restrict__ partials) {
  __shared__ float lanes[kSums][kRowLanes][kTileColumns];
  const int tx = threadIdx.x % kTileThreads, lane = threadIdx.x / kTileThreads;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * kTileColumns;
  const int64_t col = tile + tx * kColumns;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  float acc[kSums][kColumns];
#pragma unroll
  for (int s = 0; s < kSums; ++s)
#pragma unroll
    for (int i = 0; i < kColumns; ++i) acc[s][i] = 0.0f;
  if (col < cols) {
#pragma unroll 4
    for (int64_t r = begin + lane; r < end; r += kRowLanes) op(r, col, acc);
  }
#pragma unroll
  for (int s = 0; s < kSums; ++s)
#pragma unroll
    for (int i = 0; i < kColumns; ++i) lanes[s][lane][tx * kColumns + i] = acc[s][i];
  __syncthreads();
  const int c = threadIdx.x;
  if (tile + c >= cols) return;
#pragma unroll
  for (int s = 0; s < kSums; ++s) {
    float total = 0.0f;
#pragma unroll
    for (int l = 0; l < kRowLanes; ++l) total += lanes[s][l][c];
    partials[(static_cast<int64_t>(s) * gridDim.y + blockIdx.y) * cols + tile + c] = total;
  }
}

// out_s[c] = the sum over chunks of partials[s][chunk][c], for s < the grid's y (at most 2), in Out.
template <typename Out>
__global__ void add_chunks_kernel(const float* __restrict__ partials, int64_t chunks, int64_t cols, Out* out0,
                                  Out* out1) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const float* p = partials + static_cast<int64_t>(blockIdx.y) * chunks * cols + c;
  float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
  int64_t k = 0;
  for (; k + 4 <= chunks; k += 4) {
    a0 += p[k * cols];
    a1 += p[(k + 1) * cols];
    a2 += p[(k + 2) * cols];
    a3 += p[(k + 3) * cols];
  }
  for (; k < chunks; ++k) a0 += p[k * cols];
  (blockIdx.y == 0 ? out0 : out1)[c] = from_float<Out>((a0 + a1) + (a2 + a3));
}

// The sums of op over [rows, cols] into out0 (and out1 with two sums), of the C++ type of out_dtype. workspace:
// kSums * workspace_floats(rows, cols) floats.
template <int kSums, typename Op>
void launch(const char* what, const Op& op, int64_t rows, int64_t cols, Dtype out_dtype, void* out0, void* out1,
            float* workspace, cudaStream_t stream) {
  static_assert(kSums == 1 || kSums == 2, "at most two sums a pass");
  check_shape(what, rows, cols);
  const int64_t per_chunk = chunk_rows(rows), n = chunks(rows);
  const dim3 grid(static_cast<unsigned>((cols + kTileColumns - 1) / kTileColumns), static_cast<unsigned>(n));
  chunk_sums_kernel<kSums><<<grid, kBlock, 0, stream>>>(op, rows, cols, per_chunk, workspace);
  check_launch(what);
  const dim3 add_grid(static_cast<unsigned>((cols + 255) / 256), kSums);
  with_type(out_dtype, [&](auto* tag) {
    using Out = std::remove_pointer_t<decltype(tag)>;
    add_chunks_kernel<Out><<<add_grid, 256, 0, stream>>>(workspace, n, cols, static_cast<Out*>(out0),
                                                         static_cast<Out*>(out1));
  });
  check_launch(what);
}

}  // namespace ptrain::kernels::cuda::column_sums
