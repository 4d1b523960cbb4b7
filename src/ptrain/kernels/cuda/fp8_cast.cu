// The amax, scale and FP8 cast of one tensor (launch.h: fp8_scaled_cast), what every FP8 matrix product of
// kernels/fp8_linear.cpp needs for each of its operands. LibTorch's path reads x twice for the amax (abs, then
// max) and three times more for the cast (to fp32, times the scale, clamp, to FP8), writing an fp32 copy on the
// way; these two kernels read x twice and write its FP8 bytes once.
//
// Compiled without --use_fast_math (kernels/CMakeLists.txt): the result must match LibTorch's bit for bit, so
// the division, reciprocal and product are IEEE round-to-nearest and denormals are kept.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "ptrain/kernels/cuda/amax.cuh"
#include "ptrain/kernels/cuda/elements.cuh"

namespace ptrain::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 8;        // elements a thread handles at once on the vector path
constexpr int kMaxBlocks = 1024;  // grid-stride beyond: enough to fill an H200's 132 SMs several times
// torchao's EPS: an all-zero tensor gets a finite scale. Rounded from the double as LibTorch's clamp_min(1e-12)
// rounds its scalar.
constexpr float kAmaxFloor = static_cast<float>(1e-12);

template <typename T>
struct alignas(kChunk * sizeof(T)) Chunk {
  T v[kChunk];
};
struct alignas(kChunk) Bytes {
  uint8_t v[kChunk];
};

// The grid-stride walk over x's n elements that the amax and the plain cast share: with vectors, chunk(i, c)
// for each whole chunk c (elements kChunk i .. kChunk i + kChunk - 1), then element(i, x[i]) for the tail;
// without, element(i, x[i]) for every element.
template <typename T, typename ChunkFn, typename ElementFn>
__device__ __forceinline__ void grid_stride(const T* __restrict__ x, int64_t n, bool vectors, ChunkFn&& chunk,
                                            ElementFn&& element) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t tail = 0;
  if (vectors) {
    const int64_t chunks = n / kChunk;
    const auto* c = reinterpret_cast<const Chunk<T>*>(x);
    for (int64_t i = first; i < chunks; i += stride) {
      const Chunk<T> v = c[i];  // one vector load into registers, whatever chunk reads of it
      chunk(i, v);
    }
    tail = chunks * kChunk;
  }
  for (int64_t i = tail + first; i < n; i += stride) element(i, x[i]);
}

// The scale every block of a cast computes from the amax in stats[0] (the first block also writes the scale
// and its inverse to stats): fp8_max / max(amax, floor), a NaN amax kept.
__device__ __forceinline__ float scale_from_amax(float* __restrict__ stats, float fp8_max) {
  const float amax = stats[0];
  const float scale = __fdiv_rn(fp8_max, amax != amax ? amax : fmaxf(amax, kAmaxFloor));
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    stats[kFp8StatsStride] = scale;
    stats[2 * kFp8StatsStride] = __frcp_rn(scale);
  }
  return scale;
}

template <typename T>
__global__ void amax_kernel(const T* __restrict__ x, int64_t n, bool vectors, unsigned int* __restrict__ amax_bits) {
  float m = 0.0f;
  grid_stride(
      x, n, vectors,
      [&](int64_t, const Chunk<T>& v) {
#pragma unroll
        for (int k = 0; k < kChunk; ++k) m = abs_max(m, to_float(v.v[k]));
      },
      [&](int64_t, T v) { m = abs_max(m, to_float(v)); });
  block_amax_into<kThreads>(m, amax_bits);
}

template <bool E5M2>
__device__ __forceinline__ uint8_t to_fp8(float v, float scale, float fp8_max) {
  v = __fmul_rn(v, scale);
  v = v != v ? v : fminf(fmaxf(v, -fp8_max), fp8_max);
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, E5M2 ? __NV_E5M2 : __NV_E4M3));
}

template <typename T, bool E5M2>
__global__ void cast_kernel(const T* __restrict__ x, int64_t n, bool vectors, float fp8_max, float* __restrict__ stats,
                            uint8_t* __restrict__ y) {
  const float scale = scale_from_amax(stats, fp8_max);
  auto* out = reinterpret_cast<Bytes*>(y);
  grid_stride(
      x, n, vectors,
      [&](int64_t i, const Chunk<T>& v) {
        Bytes b;
#pragma unroll
        for (int k = 0; k < kChunk; ++k) b.v[k] = to_fp8<E5M2>(to_float(v.v[k]), scale, fp8_max);
        out[i] = b;
      },
      [&](int64_t i, T v) { y[i] = to_fp8<E5M2>(to_float(v), scale, fp8_max); });
}

// The cast of x [rows, cols] (row-major, both multiples of kSegment) into y (row-major, may be null) and yt, its
// transpose [cols, rows] row-major: what cuBLASLt's FP8 GEMM takes as a column-major operand. A block casts a
// kTile x kTile tile once, each thread a segment of kSegment elements along a row, and writes the tile's
// transpose from shared memory, so that every store is 16 contiguous bytes. LibTorch's transposing copy of an
// FP8 tensor moves one byte a thread with strided reads: in the FP8 linear's backward it cost more than the
// FP8 products it fed.
constexpr int kTile = 64;
constexpr int kSegment = 16;
constexpr int kSegmentsPerRow = kTile / kSegment;
static_assert(kThreads == kTile * kSegmentsPerRow, "a thread for each segment of the tile");
struct alignas(16) Segment {
  uint8_t v[kSegment];
};

template <typename T, bool E5M2>
__global__ void cast_transpose_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, bool vectors, float fp8_max,
                                      float* __restrict__ stats, uint8_t* __restrict__ y, uint8_t* __restrict__ yt,
                                      float* __restrict__ column_partials, unsigned int* __restrict__ record_amax) {
  // Rows padded by a word: the transposed reads of a warp spread over more banks.
  __shared__ alignas(16) uint8_t tile[kTile][kTile + 4];
  __shared__ float sums[kTile][kTile + 1];
  const float scale = scale_from_amax(stats, fp8_max);
  const int row_in_tile = threadIdx.x / kSegmentsPerRow;
  const int first_in_row = (threadIdx.x % kSegmentsPerRow) * kSegment;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  float seen_amax = 0.0f;  // record_amax: this thread's largest |x|
  for (int64_t tile_row = blockIdx.y; tile_row < row_tiles; tile_row += gridDim.y) {
    const int64_t r0 = tile_row * kTile;
    // rows and cols are multiples of kSegment: a segment lies wholly inside x or wholly outside.
    const int64_t r = r0 + row_in_tile, c = c0 + first_in_row;
    float v[kSegment];
    if (r < rows && c < cols) {
      const T* in = x + r * cols + c;
      if (vectors) {
#pragma unroll
        for (int h = 0; h < kSegment / kChunk; ++h) {
          const Chunk<T> chunk = reinterpret_cast<const Chunk<T>*>(in)[h];
#pragma unroll
          for (int k = 0; k < kChunk; ++k) v[h * kChunk + k] = to_float(chunk.v[k]);
        }
      } else {
#pragma unroll
        for (int k = 0; k < kSegment; ++k) v[k] = to_float(in[k]);
      }
      Segment s;
#pragma unroll
      for (int k = 0; k < kSegment; ++k) {
        s.v[k] = to_fp8<E5M2>(v[k], scale, fp8_max);
        seen_amax = abs_max(seen_amax, v[k]);
      }
      if (y != nullptr) *reinterpret_cast<Segment*>(y + r * cols + c) = s;
#pragma unroll
      for (int k = 0; k < kSegment; k += 4)
        *reinterpret_cast<uint32_t*>(&tile[row_in_tile][first_in_row + k]) = *reinterpret_cast<const uint32_t*>(&s.v[k]);
    } else {
#pragma unroll
      for (int k = 0; k < kSegment; ++k) v[k] = 0.0f;
    }
    if (column_partials != nullptr) {
#pragma unroll
      for (int k = 0; k < kSegment; ++k) sums[row_in_tile][first_in_row + k] = v[k];
    }
    __syncthreads();
    // Thread t writes row c0 + t / 4 of yt, the 16 columns from r0 + (t % 4) * 16.
    const int64_t out_row = c0 + row_in_tile, out_col = r0 + first_in_row;
    if (out_row < cols && out_col < rows) {
      Segment s;
#pragma unroll
      for (int k = 0; k < kSegment; ++k) s.v[k] = tile[first_in_row + k][row_in_tile];
      *reinterpret_cast<Segment*>(yt + out_row * rows + out_col) = s;
    }
    // The tile's column sums of x (before the cast), in row order, one thread a column.
    if (column_partials != nullptr && threadIdx.x < kTile && c0 + threadIdx.x < cols) {
      float sum = 0.0f;
      for (int i = 0; i < kTile; ++i) sum += sums[i][threadIdx.x];
      column_partials[tile_row * cols + c0 + threadIdx.x] = sum;
    }
    __syncthreads();
  }
  if (record_amax != nullptr) block_amax_into<kThreads>(seen_amax, record_amax);
}

// Delayed scaling's step (launch.h: Fp8DelayedScaling): the amax the last cast recorded (state[0]) joins the
// history (state[1..history_len], newest first), the oldest leaves; stats[0] = the history's largest, from which
// the cast computes its scale; state[0] = 0 for the cast about to record. One thread: the history is short.
__global__ void delayed_scale_kernel(float* __restrict__ state, int64_t history_len, float* __restrict__ stats) {
  for (int64_t i = history_len; i > 1; --i) state[i] = state[i - 1];
  state[1] = state[0];
  state[0] = 0.0f;
  float m = 0.0f;
  for (int64_t i = 1; i <= history_len; ++i) m = abs_max(m, state[i]);
  stats[0] = m;
}

int blocks_for(int64_t n) {
  const int64_t wanted = (n / kChunk + kThreads - 1) / kThreads;
  return static_cast<int>(wanted < 1 ? 1 : (wanted > kMaxBlocks ? kMaxBlocks : wanted));
}

}  // namespace

int64_t fp8_column_partial_rows(int64_t rows) { return (rows + kTile - 1) / kTile; }

void fp8_scaled_cast_transposed(Dtype dtype, int64_t rows, int64_t cols, bool e5m2, const Fp8CastTransposedIo& io,
                                const Fp8DelayedScaling& delayed, cudaStream_t stream) {
  const void* x = io.x;
  uint8_t *y = io.y, *yt = io.yt;
  float *column_partials = io.column_partials, *stats = io.stats;
  if (rows % kSegment != 0 || cols % kSegment != 0)
    throw std::runtime_error("fp8 cast with transpose: " + std::to_string(rows) + "x" + std::to_string(cols) +
                                " is not a multiple of " + std::to_string(kSegment) + " both ways");
  // Every segment store is 16 bytes at a multiple of 16 from the start: the starts must be aligned.
  if (reinterpret_cast<uintptr_t>(yt) % 16 != 0 || (y != nullptr && reinterpret_cast<uintptr_t>(y) % 16 != 0))
    throw std::runtime_error("fp8 cast with transpose: outputs not 16-byte aligned");
  if (delayed.state != nullptr && delayed.history_len < 1)
    throw std::runtime_error("fp8 cast with delayed scaling: a history of " + std::to_string(delayed.history_len));
  if (delayed.state != nullptr && io.amax_given)
    throw std::runtime_error("fp8 cast: a given amax is dynamic scaling's; delayed scaling takes its history's");
  const int64_t n = rows * cols;
  if (n == 0) {
    if (!io.amax_given && cudaMemsetAsync(stats, 0, sizeof(float), stream) != cudaSuccess)
      check_launch("fp8_scaled_cast memset");
    return;
  }
  const float fp8_max = e5m2 ? 57344.0f : 448.0f;
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
                  static_cast<unsigned>(std::min<int64_t>((rows + kTile - 1) / kTile, 65535)));
  with_type(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* in = static_cast<const T*>(x);
    // Rows of a multiple of 16 elements keep every segment on a chunk boundary when x's start is on one.
    const bool vectors = reinterpret_cast<uintptr_t>(in) % sizeof(Chunk<T>) == 0;
    unsigned int* record = nullptr;
    // The amax pass: dynamic scaling's every time, delayed scaling's on its first cast only (it fills the history).
    // With amax_given, x's producer wrote it into stats[0] already.
    float* amax_out = delayed.state == nullptr ? (io.amax_given ? nullptr : stats)
                                               : (delayed.primed ? nullptr : delayed.state);
    if (amax_out != nullptr) {
      if (cudaMemsetAsync(amax_out, 0, sizeof(float), stream) != cudaSuccess) check_launch("fp8_scaled_cast memset");
      amax_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(in, n, vectors, reinterpret_cast<unsigned int*>(amax_out));
      check_launch("fp8 amax");
    }
    if (delayed.state != nullptr) {
      delayed_scale_kernel<<<1, 1, 0, stream>>>(delayed.state, delayed.history_len, stats);
      check_launch("fp8 delayed scale");
      record = reinterpret_cast<unsigned int*>(delayed.state);
    }
    if (e5m2) {
      cast_transpose_kernel<T, true><<<grid, kThreads, 0, stream>>>(in, rows, cols, vectors, fp8_max, stats, y, yt,
                                                                    column_partials, record);
    } else {
      cast_transpose_kernel<T, false><<<grid, kThreads, 0, stream>>>(in, rows, cols, vectors, fp8_max, stats, y, yt,
                                                                     column_partials, record);
    }
    check_launch("fp8 scale, cast and transpose");
  });
}

void fp8_scaled_cast(Dtype dtype, const void* x, int64_t n, bool e5m2, uint8_t* y, float* stats, cudaStream_t stream,
                     bool amax_given) {
  if (!amax_given && cudaMemsetAsync(stats, 0, sizeof(float), stream) != cudaSuccess)
    check_launch("fp8_scaled_cast memset");
  const float fp8_max = e5m2 ? 57344.0f : 448.0f;
  const int blocks = blocks_for(n);
  with_type(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* in = static_cast<const T*>(x);
    // The vector path needs x and y aligned to a chunk; LibTorch's allocations (256 bytes) are, a view may not be.
    const bool vectors = reinterpret_cast<uintptr_t>(in) % sizeof(Chunk<T>) == 0 &&
                         reinterpret_cast<uintptr_t>(y) % sizeof(Bytes) == 0;
    if (n > 0 && !amax_given) {
      amax_kernel<T><<<blocks, kThreads, 0, stream>>>(in, n, vectors, reinterpret_cast<unsigned int*>(stats));
      check_launch("fp8 amax");
    }
    if (e5m2) {
      cast_kernel<T, true><<<blocks, kThreads, 0, stream>>>(in, n, vectors, fp8_max, stats, y);
    } else {
      cast_kernel<T, false><<<blocks, kThreads, 0, stream>>>(in, n, vectors, fp8_max, stats, y);
    }
    check_launch("fp8 scale and cast");
  });
}

}  // namespace ptrain::kernels::cuda
