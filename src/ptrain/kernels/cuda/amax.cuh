// The largest |x| of a tensor, reduced across a block and into one device word by atomicMax: what an FP8 cast
// scales by (fp8_cast.cu), computed by the cast's own pass or by the kernel that wrote x (layer_norm.cu,
// linear.cu), so that the cast reads x once instead of twice. Included by the .cu files only.
#pragma once

#include <cstdint>

namespace ptrain::kernels::cuda {

// The larger of m and |v|, NaN once either is (as LibTorch's max).
__device__ __forceinline__ float abs_max(float m, float v) {
  const float a = fabsf(v);
  return (a > m || a != a) ? a : m;
}

// The block's largest m (each thread's |x| so far) into *amax_bits by atomicMax. Every thread of the block calls
// it, the block being kThreads threads (a multiple of 32).
template <int kThreads>
__device__ __forceinline__ void block_amax_into(float m, unsigned int* amax_bits) {
  constexpr int kWarp = 32;
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

}  // namespace ptrain::kernels::cuda
