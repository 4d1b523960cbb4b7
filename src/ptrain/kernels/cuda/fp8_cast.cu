// The amax, scale and FP8 cast of one tensor (launch.h: fp8_scaled_cast), what every FP8 matrix product of
// kernels/fp8_linear.cpp needs for each of its operands. LibTorch's path reads x twice for the amax (abs, then
// max) and three times more for the cast (to fp32, times the scale, clamp, to FP8), writing an fp32 copy on the
// way; these two kernels read x twice and write its FP8 bytes once.
//
// Compiled without --use_fast_math (kernels/CMakeLists.txt): the result must match LibTorch's bit for bit, so
// the division, reciprocal and product are IEEE round-to-nearest and denormals are kept.
#include <cuda_fp8.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "ptrain/kernels/cuda/elements.cuh"

namespace ptrain::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
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

// The larger of m and |v|, NaN once either is (as LibTorch's max).
__device__ __forceinline__ float abs_max(float m, float v) {
  const float a = fabsf(v);
  return (a > m || a != a) ? a : m;
}

template <typename T>
__global__ void amax_kernel(const T* __restrict__ x, int64_t n, bool vectors, unsigned int* __restrict__ amax_bits) {
  float m = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t tail = 0;
  if (vectors) {
    const int64_t chunks = n / kChunk;
    const auto* c = reinterpret_cast<const Chunk<T>*>(x);
    for (int64_t i = first; i < chunks; i += stride) {
      const Chunk<T> v = c[i];
#pragma unroll
      for (int k = 0; k < kChunk; ++k) m = abs_max(m, to_float(v.v[k]));
    }
    tail = chunks * kChunk;
  }
  for (int64_t i = tail + first; i < n; i += stride) m = abs_max(m, to_float(x[i]));
  for (int offset = kWarp / 2; offset > 0; offset /= 2) m = abs_max(m, __shfl_xor_sync(0xffffffffu, m, offset));
  __shared__ float warps[kThreads / kWarp];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) warps[warp] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / kWarp; ++w) m = abs_max(m, warps[w]);
    // |x| has no sign bit, so the bits of non-negative floats (and of a NaN without sign) order as the floats.
    atomicMax(amax_bits, __float_as_uint(m));
  }
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
  const float amax = stats[0];
  const float scale = __fdiv_rn(fp8_max, amax != amax ? amax : fmaxf(amax, kAmaxFloor));
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    stats[kFp8StatsStride] = scale;
    stats[2 * kFp8StatsStride] = __frcp_rn(scale);
  }
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t tail = 0;
  if (vectors) {
    const int64_t chunks = n / kChunk;
    const auto* c = reinterpret_cast<const Chunk<T>*>(x);
    auto* out = reinterpret_cast<Bytes*>(y);
    for (int64_t i = first; i < chunks; i += stride) {
      const Chunk<T> v = c[i];
      Bytes b;
#pragma unroll
      for (int k = 0; k < kChunk; ++k) b.v[k] = to_fp8<E5M2>(to_float(v.v[k]), scale, fp8_max);
      out[i] = b;
    }
    tail = chunks * kChunk;
  }
  for (int64_t i = tail + first; i < n; i += stride) y[i] = to_fp8<E5M2>(to_float(x[i]), scale, fp8_max);
}

int blocks_for(int64_t n) {
  const int64_t wanted = (n / kChunk + kThreads - 1) / kThreads;
  return static_cast<int>(wanted < 1 ? 1 : (wanted > kMaxBlocks ? kMaxBlocks : wanted));
}

}  // namespace

void fp8_scaled_cast(Dtype dtype, const void* x, int64_t n, bool e5m2, uint8_t* y, float* stats, cudaStream_t stream) {
  if (cudaMemsetAsync(stats, 0, sizeof(float), stream) != cudaSuccess) check_launch("fp8_scaled_cast memset");
  const float fp8_max = e5m2 ? 57344.0f : 448.0f;
  const int blocks = blocks_for(n);
  with_type(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* in = static_cast<const T*>(x);
    // The vector path needs x and y aligned to a chunk; LibTorch's allocations (256 bytes) are, a view may not be.
    const bool vectors = reinterpret_cast<uintptr_t>(in) % sizeof(Chunk<T>) == 0 &&
                         reinterpret_cast<uintptr_t>(y) % sizeof(Bytes) == 0;
    if (n > 0) {
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
