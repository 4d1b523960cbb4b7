// Batch normalisation + ReLU (+ residual add) for NHWC training, forward and backward, as three passes over
// the activations each way where LibTorch's unfused path takes five forward and eight backward:
//   forward:  statistics (read x) -> finalize (per channel) -> apply (read x [and residual], write y)
//   backward: reduce (read dy, y, x) -> finalize (per channel) -> apply (read dy, y, x, write dx [and dres])
// The ReLU's mask is the sign of y, which the next layer keeps anyway, so nothing extra is saved.
// Activations are [rows, channels] row-major (channels-last); every thread owns a 16-byte vector of channels
// and walks a share of the rows, so loads are 16 bytes wide and coalesced along the channels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "ptrain/kernels/cuda/launch.h"

namespace ptrain::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxChunks = 512;  // row chunks of the reductions: several blocks per multiprocessor

__device__ __forceinline__ float load_float(const float* p) { return *p; }
__device__ __forceinline__ float load_float(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float load_float(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store_float(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_float(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store_float(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// V elements of T in one 16-byte load or store.
template <typename T>
struct alignas(16) Vec {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

template <typename T>
__device__ __forceinline__ void to_floats(const Vec<T>& in, float* out) {
#pragma unroll
  for (int i = 0; i < Vec<T>::kSize; ++i) out[i] = load_float(&in.v[i]);
}

template <typename T>
__device__ __forceinline__ Vec<T> from_floats(const float* in) {
  Vec<T> out;
#pragma unroll
  for (int i = 0; i < Vec<T>::kSize; ++i) store_float(&out.v[i], in[i]);
  return out;
}

// How the threads of a reduction block cover a tile: `groups` channel vectors a row, `lanes` threads along
// them (all of them, or 256 at a time across blockIdx.y), `row_lanes` rows at once.
struct Tiling {
  int64_t groups;
  int lanes, row_lanes;
  int64_t chunks, rows_per_chunk;
};

Tiling tiling_for(int64_t rows, int64_t channels, int vector) {
  Tiling t;
  t.groups = channels / vector;
  t.lanes = static_cast<int>(std::min<int64_t>(t.groups, kThreads));
  t.row_lanes = kThreads / t.lanes;
  const int64_t y_blocks = (t.groups + t.lanes - 1) / t.lanes;
  t.chunks = std::max<int64_t>(1, std::min<int64_t>(kMaxChunks / y_blocks, (rows + t.row_lanes - 1) / t.row_lanes));
  t.rows_per_chunk = (rows + t.chunks - 1) / t.chunks;
  return t;
}

// Pass 1 of the forward: per chunk of rows and per channel, the mean and the sum of squared deviations (m2).
template <typename T>
__global__ void stats_kernel(const T* __restrict__ x, int64_t rows, int64_t channels, Tiling t,
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
  if (active) {
    for (int64_t r = begin + row_lane; r < end; r += t.row_lanes) {
      const Vec<T> in = *reinterpret_cast<const Vec<T>*>(x + r * channels + group * V);
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
    }
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

// Pass 2: one thread a channel merges the chunks, updates the running statistics, and writes what the
// apply pass and the backward need.
template <typename P>
__global__ void stats_finalize_kernel(const float* __restrict__ chunk_mean, const float* __restrict__ chunk_m2,
                                      int64_t rows, int64_t channels, Tiling t, const P* __restrict__ weight,
                                      const P* __restrict__ bias, P* __restrict__ running_mean,
                                      P* __restrict__ running_var, float momentum, float eps, float* __restrict__ mean_out,
                                      float* __restrict__ invstd_out, float* __restrict__ scale_shift) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  float mean = 0.0f, m2 = 0.0f, n = 0.0f;
  for (int64_t k = 0; k < t.chunks; ++k) {
    const int64_t begin = k * t.rows_per_chunk;
    const int64_t chunk_end = begin + t.rows_per_chunk < rows ? begin + t.rows_per_chunk : rows;
    const float nb = chunk_end > begin ? static_cast<float>(chunk_end - begin) : 0.0f;
    if (nb == 0.0f) continue;
    const float total = n + nb;
    const float delta = chunk_mean[k * channels + c] - mean;
    mean += delta * nb / total;
    m2 += chunk_m2[k * channels + c] + delta * delta * n * nb / total;
    n = total;
  }
  const float var = m2 / fmaxf(n, 1.0f);
  const float invstd = rsqrtf(var + eps);
  mean_out[c] = mean;
  invstd_out[c] = invstd;
  const float w = weight ? load_float(weight + c) : 1.0f, b = bias ? load_float(bias + c) : 0.0f;
  scale_shift[c] = w * invstd;
  scale_shift[channels + c] = b - mean * w * invstd;
  if (running_mean) {
    store_float(running_mean + c, (1.0f - momentum) * load_float(running_mean + c) + momentum * mean);
    const float unbiased = n > 1.0f ? m2 / (n - 1.0f) : var;
    store_float(running_var + c, (1.0f - momentum) * load_float(running_var + c) + momentum * unbiased);
  }
}

template <typename T>
__global__ void apply_kernel(const T* __restrict__ x, const T* __restrict__ residual, const float* __restrict__ scale_shift,
                             int64_t vectors, int64_t groups, int64_t channels, T* __restrict__ y) {
  constexpr int V = Vec<T>::kSize;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c0 = (i % groups) * V;
    float v[V];
    to_floats(reinterpret_cast<const Vec<T>*>(x)[i], v);
    float r[V];
    if (residual) to_floats(reinterpret_cast<const Vec<T>*>(residual)[i], r);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float out = v[k] * scale_shift[c0 + k] + scale_shift[channels + c0 + k];
      if (residual) out += r[k];
      v[k] = fmaxf(out, 0.0f);
    }
    reinterpret_cast<Vec<T>*>(y)[i] = from_floats<T>(v);
  }
}

// Backward pass 1: per chunk and channel, sum(g) and sum(g * xhat) with g = dy where y > 0.
template <typename T>
__global__ void backward_reduce_kernel(const T* __restrict__ dy, const T* __restrict__ y, const T* __restrict__ x,
                                       const float* __restrict__ mean, const float* __restrict__ invstd, int64_t rows,
                                       int64_t channels, Tiling t, float* __restrict__ chunk_g,
                                       float* __restrict__ chunk_gx) {
  constexpr int V = Vec<T>::kSize;
  const int lane = threadIdx.x % t.lanes, row_lane = threadIdx.x / t.lanes;
  const int64_t group = static_cast<int64_t>(blockIdx.y) * t.lanes + lane;
  const bool active = row_lane < t.row_lanes && group < t.groups;
  const int64_t begin = blockIdx.x * t.rows_per_chunk, end = min(rows, begin + t.rows_per_chunk);
  float sum_g[V], sum_gx[V], mu[V], is[V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    sum_g[i] = sum_gx[i] = 0.0f;
    mu[i] = active ? mean[group * V + i] : 0.0f;
    is[i] = active ? invstd[group * V + i] : 0.0f;
  }
  if (active) {
    for (int64_t r = begin + row_lane; r < end; r += t.row_lanes) {
      const int64_t at = r * channels + group * V;
      float g[V], out[V], in[V];
      to_floats(*reinterpret_cast<const Vec<T>*>(dy + at), g);
      to_floats(*reinterpret_cast<const Vec<T>*>(y + at), out);
      to_floats(*reinterpret_cast<const Vec<T>*>(x + at), in);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float masked = out[i] > 0.0f ? g[i] : 0.0f;
        sum_g[i] += masked;
        sum_gx[i] += masked * (in[i] - mu[i]) * is[i];
      }
    }
  }
  __shared__ float s_g[kThreads * 8], s_gx[kThreads * 8];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    s_g[threadIdx.x * V + i] = sum_g[i];
    s_gx[threadIdx.x * V + i] = sum_gx[i];
  }
  __syncthreads();
  if (row_lane != 0 || !active) return;
  for (int k = 1; k < t.row_lanes; ++k) {
    const int other = k * t.lanes + lane;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      sum_g[i] += s_g[other * V + i];
      sum_gx[i] += s_gx[other * V + i];
    }
  }
#pragma unroll
  for (int i = 0; i < V; ++i) {
    chunk_g[blockIdx.x * channels + group * V + i] = sum_g[i];
    chunk_gx[blockIdx.x * channels + group * V + i] = sum_gx[i];
  }
}

// Backward pass 2, one thread a channel: dweight, dbias and the coefficients of dx.
template <typename P>
__global__ void backward_finalize_kernel(const float* __restrict__ chunk_g, const float* __restrict__ chunk_gx,
                                         int64_t rows, int64_t channels, int64_t chunks, const float* __restrict__ invstd,
                                         const P* __restrict__ weight, P* __restrict__ dweight, P* __restrict__ dbias,
                                         float* __restrict__ coefficients) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  float g = 0.0f, gx = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) {
    g += chunk_g[k * channels + c];
    gx += chunk_gx[k * channels + c];
  }
  if (dweight) store_float(dweight + c, gx);
  if (dbias) store_float(dbias + c, g);
  const float w = weight ? load_float(weight + c) : 1.0f;
  coefficients[c] = w * invstd[c];                      // k: dx = k * (g - mean_g - xhat * mean_gx)
  coefficients[channels + c] = g / static_cast<float>(rows);   // mean_g
  coefficients[2 * channels + c] = gx / static_cast<float>(rows);  // mean_gx
}

template <typename T>
__global__ void backward_apply_kernel(const T* __restrict__ dy, const T* __restrict__ y, const T* __restrict__ x,
                                      const float* __restrict__ mean, const float* __restrict__ invstd,
                                      const float* __restrict__ coefficients, int64_t vectors, int64_t groups,
                                      int64_t channels, T* __restrict__ dx, T* __restrict__ dresidual) {
  constexpr int V = Vec<T>::kSize;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c0 = (i % groups) * V;
    float g[V], out[V], in[V], d[V];
    to_floats(reinterpret_cast<const Vec<T>*>(dy)[i], g);
    to_floats(reinterpret_cast<const Vec<T>*>(y)[i], out);
    to_floats(reinterpret_cast<const Vec<T>*>(x)[i], in);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int64_t c = c0 + k;
      const float masked = out[k] > 0.0f ? g[k] : 0.0f;
      g[k] = masked;
      const float xhat = (in[k] - mean[c]) * invstd[c];
      d[k] = coefficients[c] * (masked - coefficients[channels + c] - xhat * coefficients[2 * channels + c]);
    }
    reinterpret_cast<Vec<T>*>(dx)[i] = from_floats<T>(d);
    if (dresidual) reinterpret_cast<Vec<T>*>(dresidual)[i] = from_floats<T>(g);
  }
}

int vector_of(Dtype dtype) { return dtype == Dtype::kFloat ? 4 : 8; }

void check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw std::runtime_error(std::string(kernel) + ": " + cudaGetErrorString(status));
}

void check_shape(Dtype dtype, int64_t rows, int64_t channels) {
  if (rows <= 0 || channels <= 0 || channels % vector_of(dtype) != 0)
    throw std::runtime_error("batch_norm_relu: channels must be a positive multiple of " +
                             std::to_string(vector_of(dtype)) + ", got " + std::to_string(channels));
}

unsigned elementwise_blocks(int64_t vectors) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((vectors + kThreads - 1) / kThreads, 132 * 16)));
}

// Calls fn with a null pointer of the C++ type of dtype, to dispatch templates.
template <typename Fn>
void with_type(Dtype dtype, Fn&& fn) {
  switch (dtype) {
    case Dtype::kFloat: fn(static_cast<float*>(nullptr)); break;
    case Dtype::kHalf: fn(static_cast<__half*>(nullptr)); break;
    case Dtype::kBFloat16: fn(static_cast<__nv_bfloat16*>(nullptr)); break;
  }
}

}  // namespace

int64_t batch_norm_workspace_floats(int64_t rows, int64_t channels) {
  // Two float planes of chunks x channels (forward: mean, m2; backward: g, gx), plus 3 x channels.
  const Tiling t = tiling_for(rows, channels, 8);
  const Tiling f = tiling_for(rows, channels, 4);
  return 2 * std::max(t.chunks, f.chunks) * channels + 3 * channels;
}

void batch_norm_stats(Dtype dtype, Dtype param, const void* x, int64_t rows, int64_t channels, const void* weight,
                      const void* bias, void* running_mean, void* running_var, double momentum, double eps,
                      float* mean, float* invstd, float* scale_shift, float* workspace, cudaStream_t stream) {
  check_shape(dtype, rows, channels);
  const Tiling t = tiling_for(rows, channels, vector_of(dtype));
  float* chunk_mean = workspace;
  float* chunk_m2 = workspace + t.chunks * channels;
  const dim3 grid(static_cast<unsigned>(t.chunks), static_cast<unsigned>((t.groups + t.lanes - 1) / t.lanes));
  with_type(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    stats_kernel<T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), rows, channels, t, chunk_mean, chunk_m2);
  });
  check_launch("batch_norm_stats");
  const unsigned blocks = static_cast<unsigned>((channels + kThreads - 1) / kThreads);
  with_type(param, [&](auto* tag) {
    using P = std::remove_pointer_t<decltype(tag)>;
    stats_finalize_kernel<P><<<blocks, kThreads, 0, stream>>>(
        chunk_mean, chunk_m2, rows, channels, t, static_cast<const P*>(weight), static_cast<const P*>(bias),
        static_cast<P*>(running_mean), static_cast<P*>(running_var), static_cast<float>(momentum),
        static_cast<float>(eps), mean, invstd, scale_shift);
  });
  check_launch("batch_norm_stats_finalize");
}

void batch_norm_relu_apply(Dtype dtype, const void* x, const void* residual, const float* scale_shift, int64_t rows,
                           int64_t channels, void* y, cudaStream_t stream) {
  check_shape(dtype, rows, channels);
  const int64_t groups = channels / vector_of(dtype);
  const int64_t vectors = rows * groups;
  with_type(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    apply_kernel<T><<<elementwise_blocks(vectors), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(residual), scale_shift, vectors, groups, channels,
        static_cast<T*>(y));
  });
  check_launch("batch_norm_relu_apply");
}

void batch_norm_relu_backward(Dtype dtype, Dtype param, const void* dy, const void* y, const void* x,
                              const float* mean, const float* invstd, const void* weight, int64_t rows,
                              int64_t channels, void* dx, void* dresidual, void* dweight, void* dbias,
                              float* workspace, cudaStream_t stream) {
  check_shape(dtype, rows, channels);
  const Tiling t = tiling_for(rows, channels, vector_of(dtype));
  float* chunk_g = workspace;
  float* chunk_gx = workspace + t.chunks * channels;
  float* coefficients = workspace + 2 * t.chunks * channels;
  const dim3 grid(static_cast<unsigned>(t.chunks), static_cast<unsigned>((t.groups + t.lanes - 1) / t.lanes));
  with_type(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    backward_reduce_kernel<T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(dy), static_cast<const T*>(y),
                                                             static_cast<const T*>(x), mean, invstd, rows, channels, t,
                                                             chunk_g, chunk_gx);
  });
  check_launch("batch_norm_relu_backward_reduce");
  const unsigned blocks = static_cast<unsigned>((channels + kThreads - 1) / kThreads);
  with_type(param, [&](auto* tag) {
    using P = std::remove_pointer_t<decltype(tag)>;
    backward_finalize_kernel<P><<<blocks, kThreads, 0, stream>>>(chunk_g, chunk_gx, rows, channels, t.chunks, invstd,
                                                                 static_cast<const P*>(weight), static_cast<P*>(dweight),
                                                                 static_cast<P*>(dbias), coefficients);
  });
  check_launch("batch_norm_relu_backward_finalize");
  const int64_t groups = channels / vector_of(dtype);
  const int64_t vectors = rows * groups;
  with_type(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    backward_apply_kernel<T><<<elementwise_blocks(vectors), kThreads, 0, stream>>>(
        static_cast<const T*>(dy), static_cast<const T*>(y), static_cast<const T*>(x), mean, invstd, coefficients,
        vectors, groups, channels, static_cast<T*>(dx), static_cast<T*>(dresidual));
  });
  check_launch("batch_norm_relu_backward_apply");
}

}  // namespace ptrain::kernels::cuda
