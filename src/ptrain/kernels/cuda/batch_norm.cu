// Batch normalisation + ReLU (+ residual add) for NHWC training, forward and backward, as three passes over
// the activations each way where LibTorch's unfused path takes five forward and eight backward:
//   forward:  statistics (read x) -> finalize (per channel) -> apply (read x [and residual], write y)
//   backward: reduce (read dy, x [, y]) -> finalize (per channel) -> apply (read dy, x [, y], write dx [and dres])
// A second gradient dy2 (the output's second use, kernels::batch_norm_relu's twin) is read beside dy and added.
// The ReLU's mask is recomputed from x and the per-channel scale and shift; with a residual it is the sign of
// y, which the next layer keeps anyway. Nothing beyond what the unfused layers keep is saved. Without the ReLU
// (a shortcut's batch norm) the same passes are a plain batch norm. The three passes each way run as three
// launches (the split kernels) or in one cooperative launch (the single-pass kernels, the default; below).
// Activations are [rows, channels] row-major (channels-last); every thread owns a 16-byte vector of channels
// and walks a share of the rows, so loads are 16 bytes wide and coalesced along the channels.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "ptrain/kernels/cuda/elements.cuh"
#include "ptrain/kernels/cuda/pooling.cuh"

namespace ptrain::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxChunks = 512;     // row chunks of the reductions: several blocks per multiprocessor
// ... but at least this many rows for each thread of a reduction: with 512 chunks, a small layer's threads
// read 2-13 rows each and the chunk partials outgrow the reads (ResNet-50's 2048-channel layers at 7x7 wrote
// 8 MB of partials for 24 MB of activations). bench/kernels/batch_norm_bench --warm on an H200 (bf16,
// ResNet-50, batch 128): with 8, 16 and 32 rows a thread instead of 1, the statistics of the 53 layers went
// from 1.70 ms to 1.68, 1.63 and 1.48, and their backward from 6.58 to 6.58, 6.56 and 6.47.
constexpr int kReductionRowsPerThread = 32;
constexpr int kApplyChunks = 2048;  // and of the elementwise passes, which need no merge afterwards
constexpr int kWarp = 32;
// Rows whose loads a reduction thread issues before it uses the first: a reduction that waits for each load
// before the next reached 2.2-2.9 TB/s on an H200, where the elementwise passes, with more loads in flight,
// reach 3.5-4. The values are still folded in row order, so the sums are those of the plain loop bit for bit.
constexpr int kStatsRows = 4;
constexpr int kBackwardRows = 2;  // three loads a row already (dy, x, y)
// Chunk partials a finalize lane loads before merging them, in order: 16 dependent loads one after another
// took most of the 6-9 us each finalize kernel lasted.
constexpr int kFinalizeLoads = 8;
// The single-pass kernels (below) fill the GPU with resident blocks only, so their threads take fewer rows
// than the split reductions' 32, and their apply phase issues several rows' loads at once.
constexpr int kSinglePassRowsPerThread = 16;
constexpr int kSinglePassApplyRows = 4;
constexpr int kSinglePassBackwardRows = 2;

// How the threads of a reduction block cover a tile: `groups` channel vectors a row, `lanes` threads along
// them (all of them, or 256 at a time across blockIdx.y), `row_lanes` rows at once.
struct Tiling {
  int64_t groups;
  int lanes, row_lanes;
  int64_t chunks, rows_per_chunk;
};

// Blocks of `lanes` channel vectors that cover a row (blockIdx.y), and the grid of a tiling.
int64_t channel_blocks(const Tiling& t) { return (t.groups + t.lanes - 1) / t.lanes; }
dim3 grid_of(const Tiling& t) { return dim3(static_cast<unsigned>(t.chunks), static_cast<unsigned>(channel_blocks(t))); }

Tiling tiling_for(int64_t rows, int64_t channels, int vector, int64_t max_chunks = kMaxChunks,
                  int64_t min_rows_per_thread = kReductionRowsPerThread) {
  Tiling t;
  t.groups = channels / vector;
  t.lanes = static_cast<int>(std::min<int64_t>(t.groups, kThreads));
  t.row_lanes = kThreads / t.lanes;
  const int64_t y_blocks = channel_blocks(t);
  const int64_t rows_per_chunk = t.row_lanes * min_rows_per_thread;
  t.chunks = std::max<int64_t>(1, std::min<int64_t>(max_chunks / y_blocks, (rows + rows_per_chunk - 1) / rows_per_chunk));
  t.rows_per_chunk = (rows + t.chunks - 1) / t.chunks;
  return t;
}

// Pass 1 of the forward: per chunk of rows and per channel, the mean and the sum of squared deviations (m2).
// Four blocks a multiprocessor (64 registers), so that the 512 chunks of a large layer run in one wave.
template <typename T>
__device__ __forceinline__ void chunk_statistics(const T* __restrict__ x, int64_t rows, int64_t channels, const Tiling& t,
                                                 float* __restrict__ chunk_mean, float* __restrict__ chunk_m2) {
  constexpr int V = Vec<T>::kSize;
  const int lane = threadIdx.x % t.lanes, row_lane = threadIdx.x / t.lanes;
  const int64_t group = static_cast<int64_t>(blockIdx.y) * t.lanes + lane;
  const bool active = row_lane < t.row_lanes && group < t.groups;
  const int64_t begin = blockIdx.x * t.rows_per_chunk, end = min(rows, begin + t.rows_per_chunk);
  float mean[V], m2[V];
#pragma unroll
  for (int i = 0; i < V; ++i) mean[i] = m2[i] = 0.0f;
  float n = 0.0f;
  const auto fold = [&](const Vec<T>& in) {
    float v[V];
    to_floats(in, v);
    n += 1.0f;
    const float inv_n = 1.0f / n;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float delta = v[i] - mean[i];
      mean[i] += delta * inv_n;
      m2[i] += delta * (v[i] - mean[i]);
    }
  };
  if (active) {
    const T* base = x + group * V;
    int64_t r = begin + row_lane;
    for (; r + (kStatsRows - 1) * t.row_lanes < end; r += kStatsRows * t.row_lanes) {
      Vec<T> in[kStatsRows];
#pragma unroll
      for (int u = 0; u < kStatsRows; ++u) in[u] = *reinterpret_cast<const Vec<T>*>(base + (r + u * t.row_lanes) * channels);
#pragma unroll
      for (int u = 0; u < kStatsRows; ++u) fold(in[u]);
    }
    for (; r < end; r += t.row_lanes) fold(*reinterpret_cast<const Vec<T>*>(base + r * channels));
  }
  // Merge the row lanes of each channel vector (Chan et al.), through shared memory.
  __shared__ float s_mean[kThreads * 8], s_m2[kThreads * 8], s_n[kThreads];
  s_n[threadIdx.x] = n;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    s_mean[threadIdx.x * V + i] = mean[i];
    s_m2[threadIdx.x * V + i] = m2[i];
  }
  __syncthreads();
  if (row_lane != 0 || !active) return;
  for (int k = 1; k < t.row_lanes; ++k) {
    const int other = k * t.lanes + lane;
    const float nb = s_n[other];
    if (nb == 0.0f) continue;
    const float total = n + nb;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float mb = s_mean[other * V + i];
      const float delta = mb - mean[i];
      mean[i] += delta * nb / total;
      m2[i] += s_m2[other * V + i] + delta * delta * n * nb / total;
    }
    n = total;
  }
#pragma unroll
  for (int i = 0; i < V; ++i) {
    chunk_mean[blockIdx.x * channels + group * V + i] = mean[i];
    chunk_m2[blockIdx.x * channels + group * V + i] = m2[i];
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 4) stats_kernel(const T* __restrict__ x, int64_t rows, int64_t channels, Tiling t,
                                                            float* __restrict__ chunk_mean, float* __restrict__ chunk_m2) {
  chunk_statistics<T>(x, rows, channels, t, chunk_mean, chunk_m2);
}

// Pass 2 merges the chunks of each channel (Chan et al.), updates the running statistics, and writes what the
// apply pass and the backward need. A block takes kFinalizeChannels consecutive channels at a time (one 32-byte
// L2 sector of each chunk's partials), its threads kFinalizeChannels channels x kFinalizeLanes chunk lanes, each
// lane kFinalizeLoads chunks' loads in flight. One warp a channel, as before, read a sector for each chunk's 4
// bytes: on an H100 the single-pass forward's finalize of ResNet-50's 1024- and 2048-channel layers took 8-11 us
// of their 48-88 (batch_norm_bench --phases), 360 of its 4,180 us over the 53 layers. One thread a channel was
// latency-bound: 512 chunks read one after another, 0.13 ms a layer on an H200.
// The partials are read through L2 (__ldcg): in the single-pass kernels other blocks wrote them moments ago.
constexpr int kFinalizeChannels = 8;
constexpr int kFinalizeLanes = kThreads / kFinalizeChannels;
static_assert(kWarp % kFinalizeChannels == 0, "a warp's lanes hold whole channels");

// Block b of the grid finalizes channel groups b, b + blocks, ... of `sides` sets of `channels` channels (the dual
// kernels finalize two batch norms): fn(side, c0), c0 the group's first channel. Every thread of the block
// takes part (the group functions synchronise the block).
template <typename Fn>
__device__ __forceinline__ void for_each_channel_group_of_this_block(int64_t channels, int sides, Fn&& fn) {
  const int64_t per_side = (channels + kFinalizeChannels - 1) / kFinalizeChannels;
  const int64_t blocks = static_cast<int64_t>(gridDim.x) * gridDim.y;
  for (int64_t g = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x; g < per_side * sides; g += blocks)
    fn(static_cast<int>(g / per_side), (g % per_side) * kFinalizeChannels);
}

// What the finalize passes merge a channel's chunks into: the forward's count, mean and sum of squared
// deviations (Chan et al.), the backward's sums of g and g * xhat. shuffled: lane ^ offset's value.
struct Moments {
  float n, mean, m2;
};
struct GradientSums {
  float g, gx;
};

__device__ __forceinline__ void merge_into(Moments& a, const Moments& b) {
  const float total = a.n + b.n;
  if (total > 0.0f) {
    const float delta = b.mean - a.mean;
    a.mean += delta * b.n / total;
    a.m2 += b.m2 + delta * delta * a.n * b.n / total;
  }
  a.n = total;
}
__device__ __forceinline__ void merge_into(GradientSums& a, const GradientSums& b) { a.g += b.g, a.gx += b.gx; }

__device__ __forceinline__ Moments shuffled(const Moments& m, int offset) {
  return {__shfl_xor_sync(0xffffffffu, m.n, offset), __shfl_xor_sync(0xffffffffu, m.mean, offset),
          __shfl_xor_sync(0xffffffffu, m.m2, offset)};
}
__device__ __forceinline__ GradientSums shuffled(const GradientSums& s, int offset) {
  return {__shfl_xor_sync(0xffffffffu, s.g, offset), __shfl_xor_sync(0xffffffffu, s.gx, offset)};
}

// Within each warp, the chunk lanes of a channel (lanes ch, ch + kFinalizeChannels, ...), then the block's warps
// through shared memory, in a fixed order: returns the block's total for thread ch < kFinalizeChannels' channel.
template <typename S>
__device__ __forceinline__ S merge_chunk_lanes(S s) {
  for (int offset = kFinalizeChannels; offset < kWarp; offset *= 2) merge_into(s, shuffled(s, offset));
  __shared__ S warps[kThreads / kWarp][kFinalizeChannels];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane < kFinalizeChannels) warps[warp][lane] = s;
  __syncthreads();
  if (threadIdx.x < kFinalizeChannels) {
    for (int w = 1; w < kThreads / kWarp; ++w) merge_into(s, warps[w][threadIdx.x]);
  }
  __syncthreads();  // the next group's merge reuses `warps`
  return s;
}

template <typename P>
__device__ __forceinline__ void finalize_stats_group(int64_t c0, const float* chunk_mean, const float* chunk_m2,
                                                     int64_t rows, int64_t channels, const Tiling& t,
                                                     const P* __restrict__ weight, const P* __restrict__ bias,
                                                     P* __restrict__ running_mean, P* __restrict__ running_var,
                                                     float momentum, float eps, float* __restrict__ mean_out,
                                                     float* __restrict__ invstd_out, float* scale_shift) {
  const int64_t c = c0 + threadIdx.x % kFinalizeChannels;
  const bool active = c < channels;
  Moments m{0.0f, 0.0f, 0.0f};
  for (int64_t k0 = threadIdx.x / kFinalizeChannels; active && k0 < t.chunks; k0 += kFinalizeLoads * kFinalizeLanes) {
    float chunk_means[kFinalizeLoads], chunk_m2s[kFinalizeLoads];
#pragma unroll
    for (int u = 0; u < kFinalizeLoads; ++u) {
      const int64_t k = k0 + u * kFinalizeLanes;
      chunk_means[u] = k < t.chunks ? __ldcg(chunk_mean + k * channels + c) : 0.0f;
      chunk_m2s[u] = k < t.chunks ? __ldcg(chunk_m2 + k * channels + c) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kFinalizeLoads; ++u) {
      const int64_t k = k0 + u * kFinalizeLanes;
      const int64_t begin = k * t.rows_per_chunk;
      const int64_t chunk_end = begin + t.rows_per_chunk < rows ? begin + t.rows_per_chunk : rows;
      const float nb = k < t.chunks && chunk_end > begin ? static_cast<float>(chunk_end - begin) : 0.0f;
      if (nb > 0.0f) merge_into(m, Moments{nb, chunk_means[u], chunk_m2s[u]});
    }
  }
  m = merge_chunk_lanes(m);
  if (threadIdx.x >= kFinalizeChannels || !active) return;
  const float mean = m.mean, m2 = m.m2, n = m.n;
  const float var = m2 / fmaxf(n, 1.0f);
  const float invstd = rsqrtf(var + eps);
  mean_out[c] = mean;
  invstd_out[c] = invstd;
  const float w = weight ? to_float(weight[c]) : 1.0f, b = bias ? to_float(bias[c]) : 0.0f;
  scale_shift[c] = w * invstd;
  scale_shift[channels + c] = b - mean * w * invstd;
  if (running_mean) {
    running_mean[c] = from_float<P>((1.0f - momentum) * to_float(running_mean[c]) + momentum * mean);
    const float unbiased = n > 1.0f ? m2 / (n - 1.0f) : var;
    running_var[c] = from_float<P>((1.0f - momentum) * to_float(running_var[c]) + momentum * unbiased);
  }
}

template <typename P>
__global__ void stats_finalize_kernel(const float* __restrict__ chunk_mean, const float* __restrict__ chunk_m2,
                                      int64_t rows, int64_t channels, Tiling t, const P* __restrict__ weight,
                                      const P* __restrict__ bias, P* __restrict__ running_mean,
                                      P* __restrict__ running_var, float momentum, float eps, float* __restrict__ mean_out,
                                      float* __restrict__ invstd_out, float* __restrict__ scale_shift) {
  for_each_channel_group_of_this_block(channels, 1, [&](int, int64_t c0) {
    finalize_stats_group<P>(c0, chunk_mean, chunk_m2, rows, channels, t, weight, bias, running_mean, running_var,
                            momentum, eps, mean_out, invstd_out, scale_shift);
  });
}

// The statistics from a convolution's per-channel sum and sum of squares (cuDNN's genstats) instead of a pass
// over x, one thread a channel: what stats_finalize_kernel writes. The variance is E[x^2] - E[x]^2, in double
// so that the subtraction adds no error beyond the fp32 sums' own. With an io dtype, scale and shift are rounded
// to it first: the convolution's prologue applies the rounded values, and the backward's recomputation and ReLU
// mask must see what it saw.
template <typename P, typename IO>
__global__ void stats_from_sums_kernel(const float* __restrict__ sum, const float* __restrict__ sum_of_squares,
                                       int64_t count, int64_t channels, const P* __restrict__ weight,
                                       const P* __restrict__ bias, P* __restrict__ running_mean,
                                       P* __restrict__ running_var, float momentum, float eps, float* __restrict__ mean_out,
                                       float* __restrict__ invstd_out, float* __restrict__ scale_shift,
                                       IO* __restrict__ scale_shift_io) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const double n = static_cast<double>(count);
  const double mean = static_cast<double>(sum[c]) / n;
  const double var = fmax(static_cast<double>(sum_of_squares[c]) / n - mean * mean, 0.0);
  const float invstd = rsqrtf(static_cast<float>(var) + eps);
  mean_out[c] = static_cast<float>(mean);
  invstd_out[c] = invstd;
  const float w = weight ? to_float(weight[c]) : 1.0f, b = bias ? to_float(bias[c]) : 0.0f;
  float scale = w * invstd, shift = b - static_cast<float>(mean) * w * invstd;
  if (scale_shift_io) {
    const IO scale_io = from_float<IO>(scale), shift_io = from_float<IO>(shift);
    scale_shift_io[c] = scale_io;
    scale_shift_io[channels + c] = shift_io;
    scale = to_float(scale_io), shift = to_float(shift_io);
  }
  scale_shift[c] = scale;
  scale_shift[channels + c] = shift;
  if (running_mean) {
    running_mean[c] = from_float<P>((1.0f - momentum) * to_float(running_mean[c]) + momentum * static_cast<float>(mean));
    const double unbiased = count > 1 ? var * n / (n - 1.0) : var;
    running_var[c] = from_float<P>((1.0f - momentum) * to_float(running_var[c]) + momentum * static_cast<float>(unbiased));
  }
}

// V per-channel floats starting at channel c0, in registers. kWrittenByThisLaunch: coefficients that other
// blocks of the same (single-pass) launch wrote, read through L2 (__ldcg), which is coherent; otherwise through
// the read-only cache (__ldg): loading every block's coefficients from L2 made the split kernels' small layers
// take twice as long (ResNet-50's 14x14 applies, 12 to 27 us on an H200).
template <int V, bool kWrittenByThisLaunch = false>
__device__ __forceinline__ void load_channels(const float* p, int64_t c0, float* out) {
#pragma unroll
  for (int i = 0; i < V; i += 4) {
    const float4* at = reinterpret_cast<const float4*>(p + c0 + i);
    const float4 q = kWrittenByThisLaunch ? __ldcg(at) : __ldg(at);
    out[i] = q.x, out[i + 1] = q.y, out[i + 2] = q.z, out[i + 3] = q.w;
  }
}

// The rows of a thread's share of its block's chunk: first, first + row_lanes, ... below end, counted by j. In
// reverse (kReverse) j = 0 is the last of them: a single-pass kernel's apply phase walks its rows back from where
// the reduction phase stopped, so that the rows read last, still in L2, are read again first. Where a layer
// exceeds L2 (ResNet-50's first stage at batch 128: 50-200 MiB a tensor, against 50 MiB of L2) that spares the
// second read of the reduction's last rows; where it fits, the order changes nothing.
template <bool kReverse>
struct ThreadRows {
  int64_t first, count, stride;
  __device__ ThreadRows(const Tiling& t, int64_t rows, int row_lane) : stride(t.row_lanes) {
    const int64_t begin = blockIdx.x * t.rows_per_chunk, end = min(rows, begin + t.rows_per_chunk);
    first = begin + row_lane;
    count = first < end ? (end - first + stride - 1) / stride : 0;
  }
  __device__ __forceinline__ int64_t operator[](int64_t j) const {
    return kReverse ? first + (count - 1 - j) * stride : first + j * stride;
  }
};

// A thread's rows of its chunk in an elementwise pass: store(at, a row, b row) for each, kRows rows' loads of a and
// b (b may be null: not loaded) issued before the first row is stored; kReverse as ThreadRows.
template <typename T, int kRows, bool kReverse, typename Store>
__device__ __forceinline__ void for_each_row_of(const T* __restrict__ a, const T* __restrict__ b, int64_t rows,
                                                int64_t channels, const Tiling& t, int row_lane, int64_t c0,
                                                Store&& store) {
  // Forward order keeps the loop the two-pass apply had: ThreadRows' indexed walk cost it 2% on an H100
  // (2,727 against 2,783 us over ResNet-50's batch norms), where the single pass gained 2% from walking back.
  if constexpr (!kReverse) {
    const int64_t begin = blockIdx.x * t.rows_per_chunk, end = min(rows, begin + t.rows_per_chunk);
    int64_t r = begin + row_lane;
    for (; r + (kRows - 1) * t.row_lanes < end; r += kRows * t.row_lanes) {
      Vec<T> in[kRows], in2[kRows];
#pragma unroll
      for (int u = 0; u < kRows; ++u) {
        const int64_t at = (r + u * t.row_lanes) * channels + c0;
        in[u] = *reinterpret_cast<const Vec<T>*>(a + at);
        if (b) in2[u] = *reinterpret_cast<const Vec<T>*>(b + at);
      }
#pragma unroll
      for (int u = 0; u < kRows; ++u) store((r + u * t.row_lanes) * channels + c0, in[u], in2[u]);
    }
    for (; r < end; r += t.row_lanes) {
      const int64_t at = r * channels + c0;
      Vec<T> in2;
      if (b) in2 = *reinterpret_cast<const Vec<T>*>(b + at);
      store(at, *reinterpret_cast<const Vec<T>*>(a + at), in2);
    }
  } else {
    const ThreadRows<kReverse> mine(t, rows, row_lane);
    int64_t j = 0;
    for (; j + kRows <= mine.count; j += kRows) {
      Vec<T> in[kRows], in2[kRows];
#pragma unroll
      for (int u = 0; u < kRows; ++u) {
        const int64_t at = mine[j + u] * channels + c0;
        in[u] = *reinterpret_cast<const Vec<T>*>(a + at);
        if (b) in2[u] = *reinterpret_cast<const Vec<T>*>(b + at);
      }
#pragma unroll
      for (int u = 0; u < kRows; ++u) store(mine[j + u] * channels + c0, in[u], in2[u]);
    }
    for (; j < mine.count; ++j) {
      const int64_t at = mine[j] * channels + c0;
      Vec<T> in2;
      if (b) in2 = *reinterpret_cast<const Vec<T>*>(b + at);
      store(at, *reinterpret_cast<const Vec<T>*>(a + at), in2);
    }
  }
}

// The elementwise passes walk rows like the reductions (each thread one channel vector, a share of the
// rows), so a thread loads its channels' coefficients once instead of at every element. kRows rows' loads are
// issued before the first is used: the split passes have threads enough for one, the single-pass kernel not.
template <typename T, int kRows, bool kWrittenByThisLaunch>
__device__ __forceinline__ void apply_rows(const T* __restrict__ x, const T* __restrict__ residual,
                                           const float* scale_shift, int64_t rows, int64_t channels, const Tiling& t,
                                           bool relu, T* __restrict__ y) {
  constexpr int V = Vec<T>::kSize;
  const int lane = threadIdx.x % t.lanes, row_lane = threadIdx.x / t.lanes;
  const int64_t group = static_cast<int64_t>(blockIdx.y) * t.lanes + lane;
  if (row_lane >= t.row_lanes || group >= t.groups) return;
  const int64_t c0 = group * V;
  float scale[V], shift[V];
  load_channels<V, kWrittenByThisLaunch>(scale_shift, c0, scale);
  load_channels<V, kWrittenByThisLaunch>(scale_shift + channels, c0, shift);
  const auto store = [&](int64_t at, const Vec<T>& in, const Vec<T>& res) {
    float v[V], r[V];
    to_floats(in, v);
    if (residual) to_floats(res, r);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float out = v[k] * scale[k] + shift[k];
      if (residual) out += r[k];
      v[k] = relu ? relu_of(out) : out;
    }
    *reinterpret_cast<Vec<T>*>(y + at) = from_floats<T>(v);
  };
  for_each_row_of<T, kRows, kWrittenByThisLaunch>(x, residual, rows, channels, t, row_lane, c0, store);
}

template <typename T>
__global__ void apply_kernel(const T* __restrict__ x, const T* __restrict__ residual, const float* __restrict__ scale_shift,
                             int64_t rows, int64_t channels, Tiling t, bool relu, T* __restrict__ y) {
  apply_rows<T, 1, false>(x, residual, scale_shift, rows, channels, t, relu, y);
}

// The ReLU's mask: with a residual, the sign of the saved output; without, recomputed from x (the output's
// sign is that of x * scale + shift), so the backward never reads y. Without a ReLU, everything passes.
template <typename T, int V>
__device__ __forceinline__ void relu_mask(bool relu, bool with_y, const Vec<T>& y_row, const float* in,
                                          const float* scale, const float* shift, bool* mask) {
  if (!relu) {
#pragma unroll
    for (int i = 0; i < V; ++i) mask[i] = true;
  } else if (with_y) {
    float out[V];
    to_floats(y_row, out);
#pragma unroll
    for (int i = 0; i < V; ++i) mask[i] = out[i] > 0.0f;
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) mask[i] = in[i] * scale[i] + shift[i] > 0.0f;
  }
}

// The end of a backward reduction block: each thread's kPlanes per-channel partial sums merged over the row lanes
// through shared memory, and row lane 0 of each channel vector writing the chunk's sums, plane p to
// planes[p][chunk * channels + channel].
template <int V, int kPlanes>
__device__ __forceinline__ void write_chunk_sums(float (&sums)[kPlanes][V], const Tiling& t, bool active,
                                                 int64_t channels, float* const (&planes)[kPlanes]) {
  const int lane = threadIdx.x % t.lanes, row_lane = threadIdx.x / t.lanes;
  const int64_t group = static_cast<int64_t>(blockIdx.y) * t.lanes + lane;
  __shared__ float shared[kPlanes][kThreads * 8];
#pragma unroll
  for (int p = 0; p < kPlanes; ++p) {
#pragma unroll
    for (int i = 0; i < V; ++i) shared[p][threadIdx.x * V + i] = sums[p][i];
  }
  __syncthreads();
  if (row_lane != 0 || !active) return;
  for (int k = 1; k < t.row_lanes; ++k) {
    const int other = k * t.lanes + lane;
#pragma unroll
    for (int p = 0; p < kPlanes; ++p) {
#pragma unroll
      for (int i = 0; i < V; ++i) sums[p][i] += shared[p][other * V + i];
    }
  }
#pragma unroll
  for (int p = 0; p < kPlanes; ++p) {
#pragma unroll
    for (int i = 0; i < V; ++i) planes[p][blockIdx.x * channels + group * V + i] = sums[p][i];
  }
}

// Backward pass 1: per chunk and channel, sum(g) and sum(g * xhat) with g = dy where the output was > 0.
// kDy2: the output had a second use (a ResNet block's output feeds the next block's convolution and its
// shortcut), and dy2 is that use's gradient: g = dy + dy2, summed here instead of in a pass of its own.
template <typename T, bool kDy2>
__device__ __forceinline__ void chunk_backward_sums(const T* __restrict__ dy, const T* __restrict__ dy2,
                                                    const T* __restrict__ y,
                                                    const T* __restrict__ x, const float* mean, const float* invstd,
                                                    const float* scale_shift, int64_t rows, int64_t channels,
                                                    const Tiling& t, bool relu, float* __restrict__ chunk_g,
                                                    float* __restrict__ chunk_gx) {
  constexpr int V = Vec<T>::kSize;
  const int lane = threadIdx.x % t.lanes, row_lane = threadIdx.x / t.lanes;
  const int64_t group = static_cast<int64_t>(blockIdx.y) * t.lanes + lane;
  const bool active = row_lane < t.row_lanes && group < t.groups;
  const int64_t begin = blockIdx.x * t.rows_per_chunk, end = min(rows, begin + t.rows_per_chunk);
  float sums[2][V], mu[V], is[V], scale[V], shift[V];  // sums: g, g * xhat
#pragma unroll
  for (int i = 0; i < V; ++i) sums[0][i] = sums[1][i] = mu[i] = is[i] = scale[i] = shift[i] = 0.0f;
  if (active) {
    load_channels<V>(mean, group * V, mu);
    load_channels<V>(invstd, group * V, is);
    load_channels<V>(scale_shift, group * V, scale);
    load_channels<V>(scale_shift + channels, group * V, shift);
    // Loaded rows: dy, x and (with a residual) y, folded in row order.
    struct Row {
      Vec<T> dy, dy2, x, y;
    };
    const auto load = [&](int64_t at) {
      Row row;
      row.dy = *reinterpret_cast<const Vec<T>*>(dy + at);
      if (kDy2) row.dy2 = *reinterpret_cast<const Vec<T>*>(dy2 + at);
      row.x = *reinterpret_cast<const Vec<T>*>(x + at);
      if (y) row.y = *reinterpret_cast<const Vec<T>*>(y + at);
      return row;
    };
    const auto fold = [&](const Row& row) {
      float g[V], in[V];
      bool mask[V];
      to_floats(row.dy, g);
      if (kDy2) add_floats(row.dy2, g);
      to_floats(row.x, in);
      if (relu && y) {
        float out[V];
        to_floats(row.y, out);
#pragma unroll
        for (int i = 0; i < V; ++i) mask[i] = out[i] > 0.0f;
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) mask[i] = !relu || in[i] * scale[i] + shift[i] > 0.0f;
      }
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float masked = mask[i] ? g[i] : 0.0f;
        sums[0][i] += masked;
        sums[1][i] += masked * (in[i] - mu[i]) * is[i];
      }
    };
    int64_t r = begin + row_lane;
    constexpr int kRows = kDy2 ? 1 : kBackwardRows;  // four loads a row with dy2
    for (; r + (kRows - 1) * t.row_lanes < end; r += kRows * t.row_lanes) {
      Row rows_in[kRows];
#pragma unroll
      for (int u = 0; u < kRows; ++u) rows_in[u] = load((r + u * t.row_lanes) * channels + group * V);
#pragma unroll
      for (int u = 0; u < kRows; ++u) fold(rows_in[u]);
    }
    for (; r < end; r += t.row_lanes) fold(load(r * channels + group * V));
  }
  float* const planes[2] = {chunk_g, chunk_gx};
  write_chunk_sums<V, 2>(sums, t, active, channels, planes);
}

template <typename T, bool kDy2>
__global__ void backward_reduce_kernel(const T* __restrict__ dy, const T* __restrict__ dy2, const T* __restrict__ y,
                                       const T* __restrict__ x, const float* __restrict__ mean,
                                       const float* __restrict__ invstd, const float* __restrict__ scale_shift,
                                       int64_t rows, int64_t channels, Tiling t, bool relu, float* __restrict__ chunk_g,
                                       float* __restrict__ chunk_gx) {
  chunk_backward_sums<T, kDy2>(dy, dy2, y, x, mean, invstd, scale_shift, rows, channels, t, relu, chunk_g, chunk_gx);
}

// Backward pass 2, a block kFinalizeChannels channels at a time as the forward's: dweight, dbias and the
// coefficients of dx.
template <typename P>
__device__ __forceinline__ void finalize_backward_group(int64_t c0, const float* chunk_g, const float* chunk_gx,
                                                        int64_t rows, int64_t channels, int64_t chunks,
                                                        const float* __restrict__ invstd, const P* __restrict__ weight,
                                                        P* __restrict__ dweight, P* __restrict__ dbias,
                                                        float* coefficients) {
  const int64_t c = c0 + threadIdx.x % kFinalizeChannels;
  const bool active = c < channels;
  GradientSums sums{0.0f, 0.0f};
  for (int64_t k0 = threadIdx.x / kFinalizeChannels; active && k0 < chunks; k0 += kFinalizeLoads * kFinalizeLanes) {
    float gs[kFinalizeLoads], gxs[kFinalizeLoads];
#pragma unroll
    for (int u = 0; u < kFinalizeLoads; ++u) {
      const int64_t k = k0 + u * kFinalizeLanes;
      gs[u] = k < chunks ? __ldcg(chunk_g + k * channels + c) : 0.0f;
      gxs[u] = k < chunks ? __ldcg(chunk_gx + k * channels + c) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kFinalizeLoads; ++u) merge_into(sums, GradientSums{gs[u], gxs[u]});
  }
  sums = merge_chunk_lanes(sums);
  if (threadIdx.x >= kFinalizeChannels || !active) return;
  const float g = sums.g, gx = sums.gx;
  if (dweight) dweight[c] = from_float<P>(gx);
  if (dbias) dbias[c] = from_float<P>(g);
  const float w = weight ? to_float(weight[c]) : 1.0f;
  coefficients[c] = w * invstd[c];                                  // k: dx = k * (g - mean_g - xhat * mean_gx)
  coefficients[channels + c] = g / static_cast<float>(rows);        // mean_g
  coefficients[2 * channels + c] = gx / static_cast<float>(rows);   // mean_gx
}

template <typename P>
__global__ void backward_finalize_kernel(const float* __restrict__ chunk_g, const float* __restrict__ chunk_gx,
                                         int64_t rows, int64_t channels, int64_t chunks, const float* __restrict__ invstd,
                                         const P* __restrict__ weight, P* __restrict__ dweight, P* __restrict__ dbias,
                                         float* __restrict__ coefficients) {
  for_each_channel_group_of_this_block(channels, 1, [&](int, int64_t c0) {
    finalize_backward_group<P>(c0, chunk_g, chunk_gx, rows, channels, chunks, invstd, weight, dweight, dbias,
                               coefficients);
  });
}

template <typename T, int kRows, bool kWrittenByThisLaunch, bool kDy2>
__device__ __forceinline__ void backward_apply_rows(const T* __restrict__ dy, const T* __restrict__ dy2,
                                                    const T* __restrict__ y,
                                                    const T* __restrict__ x, const float* mean, const float* invstd,
                                                    const float* scale_shift, const float* coefficients, int64_t rows,
                                                    int64_t channels, const Tiling& t, bool relu, T* __restrict__ dx,
                                                    T* __restrict__ dresidual) {
  constexpr int V = Vec<T>::kSize;
  const int lane = threadIdx.x % t.lanes, row_lane = threadIdx.x / t.lanes;
  const int64_t group = static_cast<int64_t>(blockIdx.y) * t.lanes + lane;
  if (row_lane >= t.row_lanes || group >= t.groups) return;
  const int64_t c0 = group * V;
  float mu[V], is[V], scale[V], shift[V], k1[V], mean_g[V], mean_gx[V];
  load_channels<V>(mean, c0, mu);
  load_channels<V>(invstd, c0, is);
  load_channels<V>(scale_shift, c0, scale);
  load_channels<V>(scale_shift + channels, c0, shift);
  load_channels<V, kWrittenByThisLaunch>(coefficients, c0, k1);
  load_channels<V, kWrittenByThisLaunch>(coefficients + channels, c0, mean_g);
  load_channels<V, kWrittenByThisLaunch>(coefficients + 2 * channels, c0, mean_gx);
  const bool with_y = relu && y;
  const auto store = [&](int64_t at, const Vec<T>& dy_in, const Vec<T>& dy2_in, const Vec<T>& x_in,
                         const Vec<T>& y_in) {
    float g[V], in[V], d[V];
    bool mask[V];
    to_floats(dy_in, g);
    if (kDy2) add_floats(dy2_in, g);
    to_floats(x_in, in);
    relu_mask<T, V>(relu, with_y, y_in, in, scale, shift, mask);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      g[k] = mask[k] ? g[k] : 0.0f;
      const float xhat = (in[k] - mu[k]) * is[k];
      d[k] = k1[k] * (g[k] - mean_g[k] - xhat * mean_gx[k]);
    }
    *reinterpret_cast<Vec<T>*>(dx + at) = from_floats<T>(d);
    if (dresidual) *reinterpret_cast<Vec<T>*>(dresidual + at) = from_floats<T>(g);
  };
  // The single pass (kWrittenByThisLaunch) walks back from where its reduction stopped (ThreadRows); the
  // two-pass backward keeps its forward loop, as for_each_row_of does.
  if constexpr (!kWrittenByThisLaunch) {
    const int64_t begin = blockIdx.x * t.rows_per_chunk, end = min(rows, begin + t.rows_per_chunk);
    int64_t r = begin + row_lane;
    for (; r + (kRows - 1) * t.row_lanes < end; r += kRows * t.row_lanes) {
      Vec<T> dy_in[kRows], dy2_in[kRows], x_in[kRows], y_in[kRows];
#pragma unroll
      for (int u = 0; u < kRows; ++u) {
        const int64_t at = (r + u * t.row_lanes) * channels + c0;
        dy_in[u] = *reinterpret_cast<const Vec<T>*>(dy + at);
        if (kDy2) dy2_in[u] = *reinterpret_cast<const Vec<T>*>(dy2 + at);
        x_in[u] = *reinterpret_cast<const Vec<T>*>(x + at);
        if (with_y) y_in[u] = *reinterpret_cast<const Vec<T>*>(y + at);
      }
#pragma unroll
      for (int u = 0; u < kRows; ++u) store((r + u * t.row_lanes) * channels + c0, dy_in[u], dy2_in[u], x_in[u], y_in[u]);
    }
    for (; r < end; r += t.row_lanes) {
      const int64_t at = r * channels + c0;
      Vec<T> dy2_in, y_in;
      if (kDy2) dy2_in = *reinterpret_cast<const Vec<T>*>(dy2 + at);
      if (with_y) y_in = *reinterpret_cast<const Vec<T>*>(y + at);
      store(at, *reinterpret_cast<const Vec<T>*>(dy + at), dy2_in, *reinterpret_cast<const Vec<T>*>(x + at), y_in);
    }
  } else {
    const ThreadRows<kWrittenByThisLaunch> mine(t, rows, row_lane);
    int64_t j = 0;
    for (; j + kRows <= mine.count; j += kRows) {
      Vec<T> dy_in[kRows], dy2_in[kRows], x_in[kRows], y_in[kRows];
#pragma unroll
      for (int u = 0; u < kRows; ++u) {
        const int64_t at = mine[j + u] * channels + c0;
        dy_in[u] = *reinterpret_cast<const Vec<T>*>(dy + at);
        if (kDy2) dy2_in[u] = *reinterpret_cast<const Vec<T>*>(dy2 + at);
        x_in[u] = *reinterpret_cast<const Vec<T>*>(x + at);
        if (with_y) y_in[u] = *reinterpret_cast<const Vec<T>*>(y + at);
      }
#pragma unroll
      for (int u = 0; u < kRows; ++u) store(mine[j + u] * channels + c0, dy_in[u], dy2_in[u], x_in[u], y_in[u]);
    }
    for (; j < mine.count; ++j) {
      const int64_t at = mine[j] * channels + c0;
      Vec<T> dy2_in, y_in;
      if (kDy2) dy2_in = *reinterpret_cast<const Vec<T>*>(dy2 + at);
      if (with_y) y_in = *reinterpret_cast<const Vec<T>*>(y + at);
      store(at, *reinterpret_cast<const Vec<T>*>(dy + at), dy2_in, *reinterpret_cast<const Vec<T>*>(x + at), y_in);
    }
  }
}

template <typename T, bool kDy2>
__global__ void backward_apply_kernel(const T* __restrict__ dy, const T* __restrict__ dy2, const T* __restrict__ y,
                                      const T* __restrict__ x, const float* __restrict__ mean,
                                      const float* __restrict__ invstd, const float* __restrict__ scale_shift,
                                      const float* __restrict__ coefficients, int64_t rows, int64_t channels, Tiling t,
                                      bool relu, T* __restrict__ dx, T* __restrict__ dresidual) {
  backward_apply_rows<T, 1, false, kDy2>(dy, dy2, y, x, mean, invstd, scale_shift, coefficients, rows, channels, t, relu,
                                         dx, dresidual);
}

// Small layers lose their time to launches and to the finalize kernels between the passes, not to memory: a
// 6 MiB layer of ResNet-50's last stage took 15 us for its statistics and 11 for its apply against 9 for a
// copy (bench/kernels/batch_norm_bench). The single-pass kernels run the three passes in one cooperative
// launch: every block reduces its chunk of rows, all meet at a grid-wide barrier, blocks across the grid
// finalize the channels, all meet again, and each block applies the rows it reduced (from L2 when the layer
// fits there). On an H200 they beat the split kernels at each of ResNet-50's 53 shapes, the 196 MiB ones too
// (bf16, L2 cold, summed over the 53 layers: forward 3.74 ms split against 3.54, backward 6.41 against 5.76), so
// they are the default.
namespace cg = cooperative_groups;

// The GPU's nanosecond clock, for stamping a kernel's phases (batch_norm_bench --phases).
__device__ __forceinline__ unsigned long long global_nanoseconds() {
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

// Thread 0 of each block writes the clock to stamps[block * kBatchNormForwardStamps + k], k the phase (launch.h),
// where stamps is given (a bench's request; null in training).
__device__ __forceinline__ void stamp(unsigned long long* stamps, int k) {
  if (stamps != nullptr && threadIdx.x == 0)
    stamps[(static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * kBatchNormForwardStamps + k] =
        global_nanoseconds();
}

template <typename T, typename P>
__global__ void __launch_bounds__(kThreads) single_pass_forward_kernel(
    const T* __restrict__ x, const T* __restrict__ residual, int64_t rows, int64_t channels, Tiling t,
    const P* __restrict__ weight, const P* __restrict__ bias, P* __restrict__ running_mean, P* __restrict__ running_var,
    float momentum, float eps, bool relu, float* chunk_mean, float* chunk_m2, float* mean, float* invstd,
    float* scale_shift, T* __restrict__ y, unsigned long long* stamps) {
  const cg::grid_group grid = cg::this_grid();
  stamp(stamps, 0);
  chunk_statistics<T>(x, rows, channels, t, chunk_mean, chunk_m2);
  stamp(stamps, 1);
  grid.sync();
  stamp(stamps, 2);
  for_each_channel_group_of_this_block(channels, 1, [&](int, int64_t c0) {
    finalize_stats_group<P>(c0, chunk_mean, chunk_m2, rows, channels, t, weight, bias, running_mean, running_var,
                            momentum, eps, mean, invstd, scale_shift);
  });
  stamp(stamps, 3);
  grid.sync();
  stamp(stamps, 4);
  apply_rows<T, kSinglePassApplyRows, true>(x, residual, scale_shift, rows, channels, t, relu, y);
  if (stamps != nullptr) __syncthreads();  // every thread's rows applied before the last stamp
  stamp(stamps, 5);
}

template <typename T, typename P, bool kDy2>
__global__ void __launch_bounds__(kThreads, 2) single_pass_backward_kernel(
    const T* __restrict__ dy, const T* __restrict__ dy2, const T* __restrict__ y, const T* __restrict__ x,
    const float* __restrict__ mean,
    const float* __restrict__ invstd, const float* __restrict__ scale_shift, const P* __restrict__ weight,
    int64_t rows, int64_t channels, Tiling t, bool relu, float* chunk_g, float* chunk_gx, float* coefficients,
    P* __restrict__ dweight, P* __restrict__ dbias, T* __restrict__ dx, T* __restrict__ dresidual) {
  const cg::grid_group grid = cg::this_grid();
  chunk_backward_sums<T, kDy2>(dy, dy2, y, x, mean, invstd, scale_shift, rows, channels, t, relu, chunk_g, chunk_gx);
  grid.sync();
  for_each_channel_group_of_this_block(channels, 1, [&](int, int64_t c0) {
    finalize_backward_group<P>(c0, chunk_g, chunk_gx, rows, channels, t.chunks, invstd, weight, dweight, dbias,
                               coefficients);
  });
  grid.sync();
  // A second gradient is a fourth tensor read a row: one row's loads at a time, as with three the registers
  // of two rows' already reach the bound of two blocks a multiprocessor.
  backward_apply_rows<T, kDy2 ? 1 : kSinglePassBackwardRows, true, kDy2>(dy, dy2, y, x, mean, invstd, scale_shift,
                                                                        coefficients, rows, channels, t, relu, dx,
                                                                        dresidual);
}

// A ResNet block that changes shape ends in relu(bn(x) + bn2(x2)): x its last convolution's output, x2 its
// shortcut convolution's. As two batch norms, the shortcut's output is written, then read back as the residual,
// and in the backward the residual's gradient is written and read back by the shortcut's batch norm. The dual
// kernels run both in one cooperative launch each way: both statistics, both finalizes, then y from x and x2
// directly; backward, one reduction for the three sums (g, g * xhat, g * xhat2, g = dy masked by y > 0) and
// one pass writing dx and dx2. Single pass only: where it cannot run, the caller composes the two batch norms.
template <typename T, int kRows>
__device__ __forceinline__ void dual_apply_rows(const T* __restrict__ x, const T* __restrict__ x2,
                                                const float* scale_shift, const float* scale_shift2, int64_t rows,
                                                int64_t channels, const Tiling& t, T* __restrict__ y) {
  constexpr int V = Vec<T>::kSize;
  const int lane = threadIdx.x % t.lanes, row_lane = threadIdx.x / t.lanes;
  const int64_t group = static_cast<int64_t>(blockIdx.y) * t.lanes + lane;
  if (row_lane >= t.row_lanes || group >= t.groups) return;
  const int64_t c0 = group * V;
  float scale[V], shift[V], scale2[V], shift2[V];
  load_channels<V, true>(scale_shift, c0, scale);
  load_channels<V, true>(scale_shift + channels, c0, shift);
  load_channels<V, true>(scale_shift2, c0, scale2);
  load_channels<V, true>(scale_shift2 + channels, c0, shift2);
  const auto store = [&](int64_t at, const Vec<T>& in, const Vec<T>& in2) {
    float v[V], v2[V];
    to_floats(in, v);
    to_floats(in2, v2);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = relu_of(v[k] * scale[k] + shift[k] + (v2[k] * scale2[k] + shift2[k]));
    *reinterpret_cast<Vec<T>*>(y + at) = from_floats<T>(v);
  };
  for_each_row_of<T, kRows, true>(x, x2, rows, channels, t, row_lane, c0, store);
}

template <typename T, typename P>
__global__ void __launch_bounds__(kThreads) single_pass_dual_forward_kernel(const T* __restrict__ x,
                                                                            const T* __restrict__ x2, int64_t rows,
                                                                            int64_t channels, Tiling t,
                                                                            BatchNormSide side, BatchNormSide side2,
                                                                            float* workspace, T* __restrict__ y) {
  const cg::grid_group grid = cg::this_grid();
  const int64_t plane = t.chunks * channels;
  chunk_statistics<T>(x, rows, channels, t, workspace, workspace + plane);
  __syncthreads();  // the second reduction reuses the first's shared memory
  chunk_statistics<T>(x2, rows, channels, t, workspace + 2 * plane, workspace + 3 * plane);
  grid.sync();
  for_each_channel_group_of_this_block(channels, 2, [&](int second, int64_t c0) {
    const BatchNormSide& s = second ? side2 : side;
    const float* partials = workspace + (second ? 2 * plane : 0);
    finalize_stats_group<P>(c0, partials, partials + plane, rows, channels, t, static_cast<const P*>(s.weight),
                            static_cast<const P*>(s.bias), static_cast<P*>(s.running_mean),
                            static_cast<P*>(s.running_var), static_cast<float>(s.momentum),
                            static_cast<float>(s.eps), s.mean, s.invstd, s.scale_shift);
  });
  grid.sync();
  dual_apply_rows<T, kSinglePassApplyRows>(x, x2, side.scale_shift, side2.scale_shift, rows, channels, t, y);
}

// Row `at` of the dual backward's inputs in fp32: g = dy (+ dy2) where y > 0, else 0; x and x2.
template <typename T, bool kDy2>
__device__ __forceinline__ void load_dual_row(const T* __restrict__ dy, const T* __restrict__ dy2,
                                              const T* __restrict__ y, const T* __restrict__ x, const T* __restrict__ x2,
                                              int64_t at, float* g, float* in, float* in2) {
  constexpr int V = Vec<T>::kSize;
  const Vec<T> dy_in = *reinterpret_cast<const Vec<T>*>(dy + at);
  Vec<T> dy2_in;
  if (kDy2) dy2_in = *reinterpret_cast<const Vec<T>*>(dy2 + at);
  const Vec<T> y_in = *reinterpret_cast<const Vec<T>*>(y + at);
  const Vec<T> x_in = *reinterpret_cast<const Vec<T>*>(x + at);
  const Vec<T> x2_in = *reinterpret_cast<const Vec<T>*>(x2 + at);
  float out[V];
  to_floats(dy_in, g);
  if (kDy2) add_floats(dy2_in, g);
  to_floats(y_in, out);
  to_floats(x_in, in);
  to_floats(x2_in, in2);
#pragma unroll
  for (int i = 0; i < V; ++i) g[i] = out[i] > 0.0f ? g[i] : 0.0f;
}

// Per chunk and channel: sum(g), sum(g * xhat) and sum(g * xhat2), g = dy (+ dy2) where y > 0. One row's five
// loads at a time, as the single-pass backward with dy2 does.
template <typename T, bool kDy2>
__device__ __forceinline__ void chunk_dual_backward_sums(const T* __restrict__ dy, const T* __restrict__ dy2,
                                                         const T* __restrict__ y, const T* __restrict__ x,
                                                         const T* __restrict__ x2, const BatchNormSide& side,
                                                         const BatchNormSide& side2, int64_t rows, int64_t channels,
                                                         const Tiling& t, float* __restrict__ chunk_g,
                                                         float* __restrict__ chunk_gx, float* __restrict__ chunk_gx2) {
  constexpr int V = Vec<T>::kSize;
  const int lane = threadIdx.x % t.lanes, row_lane = threadIdx.x / t.lanes;
  const int64_t group = static_cast<int64_t>(blockIdx.y) * t.lanes + lane;
  const bool active = row_lane < t.row_lanes && group < t.groups;
  const int64_t begin = blockIdx.x * t.rows_per_chunk, end = min(rows, begin + t.rows_per_chunk);
  float sums[3][V];  // g, g * xhat, g * xhat2
#pragma unroll
  for (int i = 0; i < V; ++i) sums[0][i] = sums[1][i] = sums[2][i] = 0.0f;
  if (active) {
    float mu[V], is[V], mu2[V], is2[V];
    load_channels<V>(side.mean, group * V, mu);
    load_channels<V>(side.invstd, group * V, is);
    load_channels<V>(side2.mean, group * V, mu2);
    load_channels<V>(side2.invstd, group * V, is2);
    for (int64_t r = begin + row_lane; r < end; r += t.row_lanes) {
      float g[V], in[V], in2[V];
      load_dual_row<T, kDy2>(dy, dy2, y, x, x2, r * channels + group * V, g, in, in2);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        sums[0][i] += g[i];
        sums[1][i] += g[i] * (in[i] - mu[i]) * is[i];
        sums[2][i] += g[i] * (in2[i] - mu2[i]) * is2[i];
      }
    }
  }
  float* const planes[3] = {chunk_g, chunk_gx, chunk_gx2};
  write_chunk_sums<V, 3>(sums, t, active, channels, planes);
}

// dx = k (g - mean_g - xhat mean_gx) and dx2 alike, from one load of dy (dy2), y, x and x2 a row.
template <typename T, bool kDy2>
__device__ __forceinline__ void dual_backward_apply_rows(const T* __restrict__ dy, const T* __restrict__ dy2,
                                                         const T* __restrict__ y, const T* __restrict__ x,
                                                         const T* __restrict__ x2, const BatchNormSide& side,
                                                         const BatchNormSide& side2, const float* coefficients,
                                                         const float* coefficients2, int64_t rows, int64_t channels,
                                                         const Tiling& t, T* __restrict__ dx, T* __restrict__ dx2) {
  constexpr int V = Vec<T>::kSize;
  const int lane = threadIdx.x % t.lanes, row_lane = threadIdx.x / t.lanes;
  const int64_t group = static_cast<int64_t>(blockIdx.y) * t.lanes + lane;
  if (row_lane >= t.row_lanes || group >= t.groups) return;
  const int64_t c0 = group * V;
  float mu[V], is[V], k1[V], mean_g[V], mean_gx[V], mu2[V], is2[V], k2[V], mean_gx2[V];
  load_channels<V>(side.mean, c0, mu);
  load_channels<V>(side.invstd, c0, is);
  load_channels<V>(side2.mean, c0, mu2);
  load_channels<V>(side2.invstd, c0, is2);
  load_channels<V, true>(coefficients, c0, k1);
  load_channels<V, true>(coefficients + channels, c0, mean_g);  // the same sum(g) on both sides
  load_channels<V, true>(coefficients + 2 * channels, c0, mean_gx);
  load_channels<V, true>(coefficients2, c0, k2);
  load_channels<V, true>(coefficients2 + 2 * channels, c0, mean_gx2);
  const int64_t begin = blockIdx.x * t.rows_per_chunk, end = min(rows, begin + t.rows_per_chunk);
  for (int64_t r = begin + row_lane; r < end; r += t.row_lanes) {
    const int64_t at = r * channels + c0;
    float g[V], d[V], d2[V];
    load_dual_row<T, kDy2>(dy, dy2, y, x, x2, at, g, d, d2);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      d[k] = k1[k] * (g[k] - mean_g[k] - (d[k] - mu[k]) * is[k] * mean_gx[k]);
      d2[k] = k2[k] * (g[k] - mean_g[k] - (d2[k] - mu2[k]) * is2[k] * mean_gx2[k]);
    }
    *reinterpret_cast<Vec<T>*>(dx + at) = from_floats<T>(d);
    *reinterpret_cast<Vec<T>*>(dx2 + at) = from_floats<T>(d2);
  }
}

template <typename T, typename P, bool kDy2>
__global__ void __launch_bounds__(kThreads, 2) single_pass_dual_backward_kernel(
    const T* __restrict__ dy, const T* __restrict__ dy2, const T* __restrict__ y, const T* __restrict__ x,
    const T* __restrict__ x2, int64_t rows, int64_t channels, Tiling t, BatchNormSide side, BatchNormSide side2,
    BatchNormGrads grads, BatchNormGrads grads2, float* workspace, T* __restrict__ dx, T* __restrict__ dx2) {
  const cg::grid_group grid = cg::this_grid();
  const int64_t plane = t.chunks * channels;
  float* chunk_g = workspace;
  float* chunk_gx = workspace + plane;
  float* chunk_gx2 = workspace + 2 * plane;
  float* coefficients = workspace + 3 * plane;
  float* coefficients2 = coefficients + 3 * channels;
  chunk_dual_backward_sums<T, kDy2>(dy, dy2, y, x, x2, side, side2, rows, channels, t, chunk_g, chunk_gx, chunk_gx2);
  grid.sync();
  for_each_channel_group_of_this_block(channels, 2, [&](int second, int64_t c0) {
    const BatchNormSide& s = second ? side2 : side;
    const BatchNormGrads& d = second ? grads2 : grads;
    finalize_backward_group<P>(c0, chunk_g, second ? chunk_gx2 : chunk_gx, rows, channels, t.chunks, s.invstd,
                               static_cast<const P*>(s.weight), static_cast<P*>(d.dweight),
                               static_cast<P*>(d.dbias), second ? coefficients2 : coefficients);
  });
  grid.sync();
  dual_backward_apply_rows<T, kDy2>(dy, dy2, y, x, x2, side, side2, coefficients, coefficients2, rows, channels, t, dx,
                                    dx2);
}

// ResNet's stem ends in max_pool(relu(bn(x))) over its largest activations. As two functions, the batch norm's
// output is written and read back by the pooling, and in the backward the pooling writes a gradient the size of x
// that the batch norm reads twice. The pool kernels run both in one cooperative launch each way: forward, the
// statistics of x, then each output's window maximum of relu(bn(x)) (rounded as the batch norm's output would be)
// straight from x; backward, each input's gradient gathered from the pooled one where the batch norm's passes
// read it (pooling.cuh: load_patch_outputs, 3x3 stride-2 pooling only), rounded as the pooling's output would be.
// The forward's values are the two functions' bit for bit (it runs on their tiling, batch_norm_relu_max_pool_forward);
// the backward's sums run in another order.
template <typename T, typename P, typename Index>
__global__ void __launch_bounds__(kThreads) single_pass_pool_forward_kernel(const T* __restrict__ x, int64_t rows,
                                                                            int64_t channels, Tiling t,
                                                                            BatchNormSide side, PoolShape s,
                                                                            float* workspace, T* __restrict__ y,
                                                                            uint8_t* __restrict__ positions) {
  constexpr int V = Vec<T>::kSize;
  const cg::grid_group grid = cg::this_grid();
  const int64_t plane = t.chunks * channels;
  chunk_statistics<T>(x, rows, channels, t, workspace, workspace + plane);
  grid.sync();
  for_each_channel_group_of_this_block(channels, 1, [&](int, int64_t c0) {
    finalize_stats_group<P>(c0, workspace, workspace + plane, rows, channels, t, static_cast<const P*>(side.weight),
                            static_cast<const P*>(side.bias), static_cast<P*>(side.running_mean),
                            static_cast<P*>(side.running_var), static_cast<float>(side.momentum),
                            static_cast<float>(side.eps), side.mean, side.invstd, side.scale_shift);
  });
  grid.sync();
  const Index groups = static_cast<Index>(channels / V);
  const Index out_h = static_cast<Index>(s.out_h), out_w = static_cast<Index>(s.out_w);
  const Index total = static_cast<Index>(s.batch * s.out_h * s.out_w) * groups;
  const Index threads = static_cast<Index>(gridDim.x * gridDim.y) * kThreads;
  for (Index i = static_cast<Index>(blockIdx.y * gridDim.x + blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += threads) {
    const VectorAt<Index> pos = vector_at(i, groups, out_h, out_w);  // (n, oh, ow)
    float scale[V], shift[V];
    load_channels<V, true>(side.scale_shift, pos.group * V, scale);
    load_channels<V, true>(side.scale_shift + channels, pos.group * V, shift);
    // relu(bn(x)) as apply_rows computes and rounds it.
    const auto normalized = [&](int k, T v) {
      const float out = to_float(v) * scale[k] + shift[k];
      return to_float(from_float<T>(relu_of(out)));
    };
    float best[V];
    Positions<V> where;
    window_maximum<T, Index>(x, s, pos.n, pos.h, pos.w, pos.group, normalized, best, where);
    const int64_t at = static_cast<int64_t>(pos.pixel) * channels + pos.group * V;
    *reinterpret_cast<Vec<T>*>(y + at) = from_floats<T>(best);
    *reinterpret_cast<Positions<V>*>(positions + at) = where;
  }
}

// The backward's walk: a thread's outputs (n, oh, ow) of its chunk (the tiling's rows are output pixels) and, for
// each, the inputs of its 2x2 patch within x: fn(at, g, x row) with g the input's gradient from the pooled one,
// masked where relu(bn(x)) was not positive.
template <typename T, typename Index, typename Fn>
__device__ __forceinline__ void for_each_patch_input(const T* __restrict__ dy, const uint8_t* __restrict__ positions,
                                                     const T* __restrict__ x, const PoolShape& s, int64_t channels,
                                                     const Tiling& t, const float* scale, const float* shift, Fn&& fn) {
  constexpr int V = Vec<T>::kSize;
  const int lane = threadIdx.x % t.lanes, row_lane = threadIdx.x / t.lanes;
  const Index group = static_cast<Index>(blockIdx.y) * t.lanes + lane;
  const Index out_h = static_cast<Index>(s.out_h), out_w = static_cast<Index>(s.out_w);
  const int64_t pixels = s.batch * s.out_h * s.out_w;
  const int64_t begin = blockIdx.x * t.rows_per_chunk, end = min(pixels, begin + t.rows_per_chunk);
  for (int64_t r = begin + row_lane; r < end; r += t.row_lanes) {
    const Index pixel = static_cast<Index>(r);
    const Index ow = pixel % out_w, oh = (pixel / out_w) % out_h, n = pixel / (out_w * out_h);
    const PatchOutputs<T> outputs = load_patch_outputs<T, Index>(dy, positions, s, n, oh, ow, group);
#pragma unroll
    for (int a = 0; a < 2; ++a) {
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const Index ih = 2 * oh + a, iw = 2 * ow + b;
        if (ih >= s.in_h || iw >= s.in_w) continue;
        const int64_t at = ((static_cast<int64_t>(n) * s.in_h + ih) * s.in_w + iw) * channels + group * V;
        float in[V], g[V];
        to_floats(*reinterpret_cast<const Vec<T>*>(x + at), in);
        patch_input_gradient(outputs, a, b, g);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float pooled = to_float(from_float<T>(g[k]));  // as the pooling's gradient is stored
          g[k] = in[k] * scale[k] + shift[k] > 0.0f ? pooled : 0.0f;
        }
        fn(at, g, in);
      }
    }
  }
}

template <typename T, typename P, typename Index>
__global__ void __launch_bounds__(kThreads, 2) single_pass_pool_backward_kernel(
    const T* __restrict__ dy, const uint8_t* __restrict__ positions, const T* __restrict__ x, int64_t channels,
    Tiling t, PoolShape s, BatchNormSide side, BatchNormGrads grads, float* workspace, T* __restrict__ dx) {
  constexpr int V = Vec<T>::kSize;
  const cg::grid_group grid = cg::this_grid();
  const int64_t plane = t.chunks * channels;
  float* chunk_g = workspace;
  float* chunk_gx = workspace + plane;
  float* coefficients = workspace + 2 * plane;
  const int lane = threadIdx.x % t.lanes, row_lane = threadIdx.x / t.lanes;
  const int64_t group = static_cast<int64_t>(blockIdx.y) * t.lanes + lane;
  const bool active = row_lane < t.row_lanes && group < t.groups;
  {
    float sums[2][V];  // g, g * xhat
#pragma unroll
    for (int i = 0; i < V; ++i) sums[0][i] = sums[1][i] = 0.0f;
    if (active) {
      float mu[V], is[V], scale[V], shift[V];
      load_channels<V>(side.mean, group * V, mu);
      load_channels<V>(side.invstd, group * V, is);
      load_channels<V>(side.scale_shift, group * V, scale);
      load_channels<V>(side.scale_shift + channels, group * V, shift);
      for_each_patch_input<T, Index>(dy, positions, x, s, channels, t, scale, shift,
                                     [&](int64_t, const float* g, const float* in) {
#pragma unroll
                                       for (int i = 0; i < V; ++i) {
                                         sums[0][i] += g[i];
                                         sums[1][i] += g[i] * (in[i] - mu[i]) * is[i];
                                       }
                                     });
    }
    float* const planes[2] = {chunk_g, chunk_gx};
    write_chunk_sums<V, 2>(sums, t, active, channels, planes);
  }
  grid.sync();
  const int64_t inputs = s.batch * s.in_h * s.in_w;
  for_each_channel_group_of_this_block(channels, 1, [&](int, int64_t c0) {
    finalize_backward_group<P>(c0, chunk_g, chunk_gx, inputs, channels, t.chunks, side.invstd,
                               static_cast<const P*>(side.weight), static_cast<P*>(grads.dweight),
                               static_cast<P*>(grads.dbias), coefficients);
  });
  grid.sync();
  if (!active) return;
  // dx = k (g - mean_g - (x - mean) invstd mean_gx) as k g + a x + b, so that fewer per-channel values stay live
  // beside the patch's loads.
  float scale[V], shift[V], k[V], a[V], b[V];
  {
    float mu[V], is[V], mean_g[V], mean_gx[V];
    load_channels<V>(side.mean, group * V, mu);
    load_channels<V>(side.invstd, group * V, is);
    load_channels<V, true>(coefficients, group * V, k);
    load_channels<V, true>(coefficients + channels, group * V, mean_g);
    load_channels<V, true>(coefficients + 2 * channels, group * V, mean_gx);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      a[i] = -k[i] * mean_gx[i] * is[i];
      b[i] = -k[i] * mean_g[i] - a[i] * mu[i];
    }
  }
  load_channels<V>(side.scale_shift, group * V, scale);
  load_channels<V>(side.scale_shift + channels, group * V, shift);
  for_each_patch_input<T, Index>(dy, positions, x, s, channels, t, scale, shift,
                                 [&](int64_t at, const float* g, const float* in) {
                                   float d[V];
#pragma unroll
                                   for (int i = 0; i < V; ++i) d[i] = k[i] * g[i] + a[i] * in[i] + b[i];
                                   *reinterpret_cast<Vec<T>*>(dx + at) = from_floats<T>(d);
                                 });
}

// Blocks of kernel that one multiprocessor holds at once (0 when the query fails), asked once per kernel.
template <auto kKernel>
int resident_blocks_per_multiprocessor() {
  static const int blocks = [] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, kThreads, 0) != cudaSuccess) {
      cudaGetLastError();  // clear it: the caller falls back to the split kernels
      return 0;
    }
    return n;
  }();
  return blocks;
}

int device_attribute(cudaDeviceAttr attribute) {
  int device = 0, value = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&value, attribute, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return value;
}

// The single pass's tiling, every block resident at once (the barrier waits for all of them), or none
// (chunks 0) when it does not apply: split asked, or fewer resident blocks than channel blocks.
template <auto kKernel>
Tiling single_pass_tiling(BatchNormPasses passes, int64_t rows, int64_t channels, int vector) {
  Tiling none{};
  none.chunks = 0;
  if (passes == BatchNormPasses::kSplit) return none;
  const int64_t resident =
      static_cast<int64_t>(resident_blocks_per_multiprocessor<kKernel>()) * device_attribute(cudaDevAttrMultiProcessorCount);
  if (resident < channel_blocks(tiling_for(rows, channels, vector))) return none;
  return tiling_for(rows, channels, vector, std::min<int64_t>(kMaxChunks, resident), kSinglePassRowsPerThread);
}

// A cooperative launch: CUDA refuses it (rather than hang) when the grid cannot be resident at once.
template <typename... Params, typename... Args>
void launch_cooperative(const char* what, void (*kernel)(Params...), dim3 grid, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute cooperative[1];
  cooperative[0].id = cudaLaunchAttributeCooperative;
  cooperative[0].val.cooperative = 1;
  config.attrs = cooperative;
  config.numAttrs = 1;
  const cudaError_t status = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
  check_launch(what);
}

// Calls fn with std::true_type or std::false_type, to dispatch a template flag.
template <typename Fn>
void with_flag(bool flag, Fn&& fn) {
  if (flag) {
    fn(std::true_type{});
  } else {
    fn(std::false_type{});
  }
}

// Calls fn with null pointers of the C++ types of the activations' dtype and the parameters', to dispatch
// templates on both.
template <typename Fn>
void with_types(Dtype dtype, Dtype param, Fn&& fn) {
  with_type(dtype, [&](auto* tag) { with_type(param, [&](auto* param_tag) { fn(tag, param_tag); }); });
}

void check_shape(Dtype dtype, int64_t rows, int64_t channels) {
  if (rows <= 0 || channels <= 0 || channels % vector_elements(dtype) != 0)
    throw std::runtime_error("batch_norm_relu: channels must be a positive multiple of " +
                             std::to_string(vector_elements(dtype)) + ", got " + std::to_string(channels));
}

}  // namespace

int64_t batch_norm_workspace_floats(int64_t rows, int64_t channels) {
  // Two float planes of chunks x channels (forward: mean, m2; backward: g, gx), plus 3 x channels; the single
  // pass's tiling has at most as many chunks as this one with its fewer rows a thread and all blocks resident.
  int64_t chunks = 0;
  for (const int vector : {8, 4}) {
    chunks = std::max(chunks, tiling_for(rows, channels, vector).chunks);
    chunks = std::max(chunks, tiling_for(rows, channels, vector, kMaxChunks, kSinglePassRowsPerThread).chunks);
  }
  return 2 * chunks * channels + 3 * channels;
}

void batch_norm_stats(const BatchNormShape& shape, const void* x, const BatchNormSide& side, float* workspace,
                      cudaStream_t stream) {
  const Dtype dtype = shape.dtype, param = shape.param;
  const int64_t rows = shape.rows, channels = shape.channels;
  check_shape(dtype, rows, channels);
  const Tiling t = tiling_for(rows, channels, vector_elements(dtype));
  float* chunk_mean = workspace;
  float* chunk_m2 = workspace + t.chunks * channels;
  const dim3 grid = grid_of(t);
  with_type(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    stats_kernel<T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), rows, channels, t, chunk_mean, chunk_m2);
  });
  check_launch("batch_norm_stats");
  const unsigned blocks = static_cast<unsigned>((channels + kThreads / kWarp - 1) / (kThreads / kWarp));
  with_type(param, [&](auto* tag) {
    using P = std::remove_pointer_t<decltype(tag)>;
    stats_finalize_kernel<P><<<blocks, kThreads, 0, stream>>>(
        chunk_mean, chunk_m2, rows, channels, t, static_cast<const P*>(side.weight), static_cast<const P*>(side.bias),
        static_cast<P*>(side.running_mean), static_cast<P*>(side.running_var), static_cast<float>(side.momentum),
        static_cast<float>(side.eps), side.mean, side.invstd, side.scale_shift);
  });
  check_launch("batch_norm_stats_finalize");
}

void batch_norm_stats_from_sums(Dtype param, Dtype io, const ChannelSums& sums, int64_t channels,
                                const BatchNormSide& side, void* scale_shift_io, cudaStream_t stream) {
  const int64_t count = sums.count;
  if (count <= 0 || channels <= 0)
    throw std::runtime_error("batch_norm_stats_from_sums: count and channels must be positive, got " +
                             std::to_string(count) + " and " + std::to_string(channels));
  const unsigned blocks = static_cast<unsigned>((channels + kThreads - 1) / kThreads);
  with_type(param, [&](auto* param_tag) {
    using P = std::remove_pointer_t<decltype(param_tag)>;
    with_type(io, [&](auto* io_tag) {
      using IO = std::remove_pointer_t<decltype(io_tag)>;
      stats_from_sums_kernel<P, IO><<<blocks, kThreads, 0, stream>>>(
          sums.sum, sums.sum_of_squares, count, channels, static_cast<const P*>(side.weight),
          static_cast<const P*>(side.bias), static_cast<P*>(side.running_mean), static_cast<P*>(side.running_var),
          static_cast<float>(side.momentum), static_cast<float>(side.eps), side.mean, side.invstd, side.scale_shift,
          static_cast<IO*>(scale_shift_io));
    });
  });
  check_launch("batch_norm_stats_from_sums");
}

void batch_norm_relu_apply(const BatchNormShape& shape, const BatchNormReluForwardIo& io, const float* scale_shift,
                           cudaStream_t stream) {
  const Dtype dtype = shape.dtype;
  const int64_t rows = shape.rows, channels = shape.channels;
  check_shape(dtype, rows, channels);
  const Tiling t = tiling_for(rows, channels, vector_elements(dtype), kApplyChunks, 1);
  const dim3 grid = grid_of(t);
  with_type(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    apply_kernel<T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(io.x), static_cast<const T*>(io.residual),
                                                   scale_shift, rows, channels, t, io.relu, static_cast<T*>(io.y));
  });
  check_launch("batch_norm_relu_apply");
}

bool batch_norm_relu_forward(const BatchNormShape& shape, const BatchNormReluForwardIo& io, const BatchNormSide& side,
                             float* workspace, cudaStream_t stream, const BatchNormForwardRun& run) {
  const Dtype dtype = shape.dtype, param = shape.param;
  const int64_t rows = shape.rows, channels = shape.channels;
  check_shape(dtype, rows, channels);
  bool single = false;
  with_type(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    with_type(param, [&](auto* param_tag) {
      using P = std::remove_pointer_t<decltype(param_tag)>;
      const Tiling t =
          single_pass_tiling<single_pass_forward_kernel<T, P>>(run.passes, rows, channels, vector_elements(dtype));
      if (t.chunks == 0) return;
      single = true;
      const dim3 grid = grid_of(t);
      if (run.phase_blocks) *run.phase_blocks = static_cast<int64_t>(grid.x) * grid.y;
      launch_cooperative("batch_norm_relu_forward (single pass)", single_pass_forward_kernel<T, P>, grid, stream,
                         static_cast<const T*>(io.x), static_cast<const T*>(io.residual), rows, channels, t,
                         static_cast<const P*>(side.weight), static_cast<const P*>(side.bias),
                         static_cast<P*>(side.running_mean), static_cast<P*>(side.running_var),
                         static_cast<float>(side.momentum), static_cast<float>(side.eps), io.relu, workspace,
                         workspace + t.chunks * channels, side.mean, side.invstd, side.scale_shift,
                         static_cast<T*>(io.y), run.phase_stamps);
    });
  });
  if (single) return true;
  batch_norm_stats(shape, io.x, side, workspace, stream);
  batch_norm_relu_apply(shape, io, side.scale_shift, stream);
  return false;
}

bool batch_norm_relu_backward(const BatchNormShape& shape, const BatchNormReluBackwardIo& io, const BatchNormSide& side,
                              const BatchNormGrads& grads, float* workspace, cudaStream_t stream,
                              BatchNormPasses passes) {
  const Dtype dtype = shape.dtype, param = shape.param;
  const int64_t rows = shape.rows, channels = shape.channels;
  const void *dy = io.dy, *dy2 = io.dy2, *y = io.y, *x = io.x, *weight = side.weight;
  const float *mean = side.mean, *invstd = side.invstd, *scale_shift = side.scale_shift;
  const bool relu = io.relu;
  void *dx = io.dx, *dresidual = io.dresidual, *dweight = grads.dweight, *dbias = grads.dbias;
  check_shape(dtype, rows, channels);
  const bool with_y = relu && y;
  bool single = false;
  with_type(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    with_type(param, [&](auto* param_tag) {
      using P = std::remove_pointer_t<decltype(param_tag)>;
      with_flag(dy2 != nullptr, [&](auto dy2_tag) {
      constexpr bool kDy2 = decltype(dy2_tag)::value;
      const Tiling s =
          single_pass_tiling<single_pass_backward_kernel<T, P, kDy2>>(passes, rows, channels, vector_elements(dtype));
      if (s.chunks == 0) return;
      single = true;
      const dim3 grid = grid_of(s);
      launch_cooperative("batch_norm_relu_backward (single pass)", single_pass_backward_kernel<T, P, kDy2>, grid, stream,
                         static_cast<const T*>(dy), static_cast<const T*>(dy2), static_cast<const T*>(with_y ? y : nullptr),
                         static_cast<const T*>(x), mean, invstd, scale_shift, static_cast<const P*>(weight), rows,
                         channels, s, relu, workspace, workspace + s.chunks * channels,
                         workspace + 2 * s.chunks * channels, static_cast<P*>(dweight), static_cast<P*>(dbias),
                         static_cast<T*>(dx), static_cast<T*>(dresidual));
      });
    });
  });
  if (single) return true;
  const Tiling t = tiling_for(rows, channels, vector_elements(dtype));
  float* chunk_g = workspace;
  float* chunk_gx = workspace + t.chunks * channels;
  float* coefficients = workspace + 2 * t.chunks * channels;
  const dim3 grid = grid_of(t);
  with_type(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    with_flag(dy2 != nullptr, [&](auto dy2_tag) {
      backward_reduce_kernel<T, decltype(dy2_tag)::value><<<grid, kThreads, 0, stream>>>(
          static_cast<const T*>(dy), static_cast<const T*>(dy2), static_cast<const T*>(y), static_cast<const T*>(x),
          mean, invstd, scale_shift, rows, channels, t, relu, chunk_g, chunk_gx);
    });
  });
  check_launch("batch_norm_relu_backward_reduce");
  const unsigned blocks = static_cast<unsigned>((channels + kThreads / kWarp - 1) / (kThreads / kWarp));
  with_type(param, [&](auto* tag) {
    using P = std::remove_pointer_t<decltype(tag)>;
    backward_finalize_kernel<P><<<blocks, kThreads, 0, stream>>>(chunk_g, chunk_gx, rows, channels, t.chunks, invstd,
                                                                 static_cast<const P*>(weight), static_cast<P*>(dweight),
                                                                 static_cast<P*>(dbias), coefficients);
  });
  check_launch("batch_norm_relu_backward_finalize");
  const Tiling a = tiling_for(rows, channels, vector_elements(dtype), kApplyChunks, 1);
  const dim3 apply_grid = grid_of(a);
  with_type(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    with_flag(dy2 != nullptr, [&](auto dy2_tag) {
      backward_apply_kernel<T, decltype(dy2_tag)::value><<<apply_grid, kThreads, 0, stream>>>(
          static_cast<const T*>(dy), static_cast<const T*>(dy2), static_cast<const T*>(y), static_cast<const T*>(x),
          mean, invstd, scale_shift, coefficients, rows, channels, a, relu, static_cast<T*>(dx),
          static_cast<T*>(dresidual));
    });
  });
  check_launch("batch_norm_relu_backward_apply");
  return false;
}

int64_t dual_batch_norm_workspace_floats(int64_t rows, int64_t channels) {
  // Four planes forward (two batch norms' mean and m2), three backward, plus six x channels; the single pass's
  // chunks are at most batch_norm_workspace_floats' own.
  return 2 * batch_norm_workspace_floats(rows, channels);
}

bool batch_norm_add_batch_norm_relu_forward(const BatchNormShape& shape, const void* x, const void* x2,
                                            const BatchNormSide& side, const BatchNormSide& side2, void* y,
                                            float* workspace, cudaStream_t stream) {
  const Dtype dtype = shape.dtype, param = shape.param;
  const int64_t rows = shape.rows, channels = shape.channels;
  check_shape(dtype, rows, channels);
  bool ran = false;
  with_types(dtype, param, [&](auto* tag, auto* param_tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using P = std::remove_pointer_t<decltype(param_tag)>;
    const Tiling t = single_pass_tiling<single_pass_dual_forward_kernel<T, P>>(BatchNormPasses::kAuto, rows, channels,
                                                                              vector_elements(dtype));
    if (t.chunks == 0) return;
    ran = true;
    launch_cooperative("batch_norm_add_batch_norm_relu_forward", single_pass_dual_forward_kernel<T, P>, grid_of(t),
                       stream, static_cast<const T*>(x), static_cast<const T*>(x2), rows, channels, t, side, side2,
                       workspace, static_cast<T*>(y));
  });
  return ran;
}

bool batch_norm_add_batch_norm_relu_backward(const BatchNormShape& shape, const DualBatchNormReluBackwardIo& io,
                                             const BatchNormSide& side, const BatchNormSide& side2,
                                             const BatchNormGrads& grads, const BatchNormGrads& grads2,
                                             float* workspace, cudaStream_t stream) {
  const Dtype dtype = shape.dtype, param = shape.param;
  const int64_t rows = shape.rows, channels = shape.channels;
  const void *dy = io.dy, *dy2 = io.dy2, *y = io.y, *x = io.x, *x2 = io.x2;
  void *dx = io.dx, *dx2 = io.dx2;
  check_shape(dtype, rows, channels);
  bool ran = false;
  with_types(dtype, param, [&](auto* tag, auto* param_tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using P = std::remove_pointer_t<decltype(param_tag)>;
    with_flag(dy2 != nullptr, [&](auto dy2_tag) {
      constexpr bool kDy2 = decltype(dy2_tag)::value;
      const Tiling t = single_pass_tiling<single_pass_dual_backward_kernel<T, P, kDy2>>(BatchNormPasses::kAuto, rows,
                                                                                       channels, vector_elements(dtype));
      if (t.chunks == 0) return;
      ran = true;
      launch_cooperative("batch_norm_add_batch_norm_relu_backward", single_pass_dual_backward_kernel<T, P, kDy2>,
                         grid_of(t), stream, static_cast<const T*>(dy), static_cast<const T*>(dy2),
                         static_cast<const T*>(y), static_cast<const T*>(x), static_cast<const T*>(x2), rows, channels,
                         t, side, side2, grads, grads2, workspace, static_cast<T*>(dx), static_cast<T*>(dx2));
    });
  });
  return ran;
}

// Whether the pool kernels' indices fit an int (their divisions take many more instructions in 64 bits).
bool pool_fits_int(const PoolShape& s) {
  const int64_t limit = 0x7fffffff - static_cast<int64_t>(512) * kThreads;
  return s.batch * s.in_h * s.in_w * s.channels < limit && s.batch * s.out_h * s.out_w * s.channels < limit;
}

// Calls fn with null pointers of the pool kernels' activation, parameter and index types.
template <typename Fn>
void with_pool_types(Dtype dtype, Dtype param, const PoolShape& pool, Fn&& fn) {
  with_types(dtype, param, [&](auto* tag, auto* param_tag) {
    if (pool_fits_int(pool)) {
      fn(tag, param_tag, static_cast<int*>(nullptr));
    } else {
      fn(tag, param_tag, static_cast<int64_t*>(nullptr));
    }
  });
}

bool batch_norm_relu_max_pool_forward(Dtype dtype, Dtype param, const PoolShape& pool,
                                      const BatchNormReluMaxPoolForwardIo& io, const BatchNormSide& side,
                                      float* workspace, cudaStream_t stream) {
  const int64_t rows = pool.batch * pool.in_h * pool.in_w, channels = pool.channels;
  check_shape(dtype, rows, channels);
  check_pool(dtype, pool);
  bool ran = false;
  with_pool_types(dtype, param, pool, [&](auto* tag, auto* param_tag, auto* index_tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using P = std::remove_pointer_t<decltype(param_tag)>;
    constexpr auto kernel = single_pass_pool_forward_kernel<T, P, std::remove_pointer_t<decltype(index_tag)>>;
    // The plain single-pass forward's tiling, not one of this kernel's own: the statistics then merge the same
    // chunks in the same order, and the pooled output is the two functions' (batch norm + ReLU, then max pooling)
    // bit for bit. Where this kernel cannot hold that grid at once (its 64-bit-index form in fp32 holds fewer blocks
    // than the plain forward), the caller runs the two.
    const Tiling t = single_pass_tiling<single_pass_forward_kernel<T, P>>(BatchNormPasses::kAuto, rows, channels,
                                                                          vector_elements(dtype));
    if (t.chunks == 0) return;
    const int64_t resident = static_cast<int64_t>(resident_blocks_per_multiprocessor<kernel>()) *
                             device_attribute(cudaDevAttrMultiProcessorCount);
    if (resident < t.chunks * channel_blocks(t)) return;
    ran = true;
    launch_cooperative("batch_norm_relu_max_pool_forward", kernel, grid_of(t), stream, static_cast<const T*>(io.x),
                       rows, channels, t, side, pool, workspace, static_cast<T*>(io.y), io.positions);
  });
  return ran;
}

bool batch_norm_relu_max_pool_backward(Dtype dtype, Dtype param, const PoolShape& pool,
                                       const BatchNormReluMaxPoolBackwardIo& io, const BatchNormSide& side,
                                       const BatchNormGrads& grads, float* workspace, cudaStream_t stream) {
  const int64_t outputs = pool.batch * pool.out_h * pool.out_w, channels = pool.channels;
  check_shape(dtype, outputs, channels);
  check_pool(dtype, pool);
  if (!is_3x3_stride_2(pool)) return false;
  bool ran = false;
  with_pool_types(dtype, param, pool, [&](auto* tag, auto* param_tag, auto* index_tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using P = std::remove_pointer_t<decltype(param_tag)>;
    constexpr auto kernel = single_pass_pool_backward_kernel<T, P, std::remove_pointer_t<decltype(index_tag)>>;
    // The tiling's rows are the output pixels, each thread's share of them its 2x2 patches of inputs.
    const Tiling t = single_pass_tiling<kernel>(BatchNormPasses::kAuto, outputs, channels, vector_elements(dtype));
    if (t.chunks == 0) return;
    ran = true;
    launch_cooperative("batch_norm_relu_max_pool_backward", kernel, grid_of(t), stream, static_cast<const T*>(io.dy),
                       io.positions, static_cast<const T*>(io.x), channels, t, pool, side, grads, workspace,
                       static_cast<T*>(io.dx));
  });
  return ran;
}

}  // namespace ptrain::kernels::cuda
