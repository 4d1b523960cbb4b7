// Max pooling's per-thread pieces over NHWC activations, shared by the pooling kernels (max_pool.cu) and the stem's
// batch norm + ReLU + max pooling (batch_norm.cu): the window maximum of one output and its position, and the
// gradients of the 2x2 patch of inputs a 3x3 stride-2 output owns. Included by the .cu files only.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "ptrain/kernels/cuda/elements.cuh"

namespace ptrain::kernels::cuda {

// The window positions of one Vec of channels.
template <int V>
struct alignas(V) Positions {
  uint8_t p[V];
};

// Vector i of an NHWC tensor walked as [batch, height, width, channel groups]: its group, its pixel (n, h, w)
// as one index, and the pixel's coordinates.
template <typename Index>
struct VectorAt {
  Index group, pixel, h, w, n;
};
template <typename Index>
__device__ __forceinline__ VectorAt<Index> vector_at(Index i, Index groups, Index height, Index width) {
  VectorAt<Index> at;
  at.group = i % groups;
  at.pixel = i / groups;
  at.w = at.pixel % width;
  at.h = (at.pixel / width) % height;
  at.n = at.pixel / (width * height);
  return at;
}

// Output (n, oh, ow)'s maximum over its window of x for channel group g, of the values value(k, element) (k the
// channel within the vector): best and where (its position in the window, row-major), LibTorch's choice: the first
// largest value, a NaN winning (the last one seen).
template <typename T, typename Index, typename Value>
__device__ __forceinline__ void window_maximum(const T* __restrict__ x, const PoolShape& s, Index n, Index oh, Index ow,
                                               Index g, Value&& value, float* best, Positions<Vec<T>::kSize>& where) {
  constexpr int V = Vec<T>::kSize;
  const Index h0 = oh * s.stride - s.padding, w0 = ow * s.stride - s.padding;
#pragma unroll
  for (int k = 0; k < V; ++k) best[k] = -INFINITY, where.p[k] = 0;
  bool first = true;
  for (int kh = 0; kh < s.kernel; ++kh) {
    const Index ih = h0 + kh;
    if (ih < 0 || ih >= s.in_h) continue;
    for (int kw = 0; kw < s.kernel; ++kw) {
      const Index iw = w0 + kw;
      if (iw < 0 || iw >= s.in_w) continue;
      const int64_t at = ((static_cast<int64_t>(n) * s.in_h + ih) * s.in_w + iw) * s.channels + g * V;
      const Vec<T> in = *reinterpret_cast<const Vec<T>*>(x + at);
      const uint8_t place = static_cast<uint8_t>(kh * s.kernel + kw);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float v = value(k, in.v[k]);
        if (first || v > best[k] || isnan(v)) best[k] = v, where.p[k] = place;
      }
      first = false;
    }
  }
}

// For a 3x3, stride-2, padding-1 pooling: input rows 2oh and 2oh + 1 (columns alike) take gradients only from
// outputs oh and oh + 1, so output (n, oh, ow) owns the 2x2 patch of inputs (2oh + a, 2ow + b), whose gradients come
// from the four outputs (oh | oh + 1, ow | ow + 1), each loaded once (load_patch_outputs); patch_input_gradient sums
// one input's, in fp32 in LibTorch's order (output rows, then columns).
template <typename T>
struct PatchOutputs {
  Vec<T> grad[4];  // [0] (oh, ow), [1] (oh, ow + 1), [2] (oh + 1, ow), [3] (oh + 1, ow + 1)
  Positions<Vec<T>::kSize> where[4];
  bool right, below;  // whether the outputs of column ow + 1 and of row oh + 1 exist
};

template <typename T, typename Index>
__device__ __forceinline__ PatchOutputs<T> load_patch_outputs(const T* __restrict__ dy,
                                                              const uint8_t* __restrict__ positions, const PoolShape& s,
                                                              Index n, Index oh, Index ow, Index g) {
  constexpr int V = Vec<T>::kSize;
  PatchOutputs<T> out;
  out.right = ow + 1 < s.out_w;
  out.below = oh + 1 < s.out_h;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (((k & 1) && !out.right) || ((k >> 1) && !out.below)) continue;
    const int64_t at = ((static_cast<int64_t>(n) * s.out_h + oh + (k >> 1)) * s.out_w + ow + (k & 1)) * s.channels + g * V;
    out.grad[k] = *reinterpret_cast<const Vec<T>*>(dy + at);
    out.where[k] = *reinterpret_cast<const Positions<V>*>(positions + at);
  }
  return out;
}

// Input (2oh + a, 2ow + b) sits at window position (a + 1 - 2da) * 3 + (b + 1 - 2db) of output (oh + da, ow + db),
// which holds it for da <= a and db <= b.
template <typename T>
__device__ __forceinline__ void patch_input_gradient(const PatchOutputs<T>& outputs, int a, int b, float* sum) {
  constexpr int V = Vec<T>::kSize;
#pragma unroll
  for (int e = 0; e < V; ++e) sum[e] = 0.0f;
#pragma unroll
  for (int da = 0; da <= a; ++da) {
#pragma unroll
    for (int db = 0; db <= b; ++db) {
      const int k = da * 2 + db;
      if ((db && !outputs.right) || (da && !outputs.below)) continue;
      const uint8_t mine = static_cast<uint8_t>((a + 1 - 2 * da) * 3 + (b + 1 - 2 * db));
#pragma unroll
      for (int e = 0; e < V; ++e)
        if (outputs.where[k].p[e] == mine) sum[e] += to_float(outputs.grad[k].v[e]);
    }
  }
}

// Throws unless the pooling kernels take s: channels in whole vectors of dtype, a window whose positions fit the one
// byte each output keeps, and padding within half the window (every window holds an input).
inline void check_pool(Dtype dtype, const PoolShape& s) {
  if (s.channels <= 0 || s.channels % vector_elements(dtype) != 0)
    throw std::runtime_error("max_pool: channels must be a positive multiple of " +
                             std::to_string(vector_elements(dtype)) + ", got " + std::to_string(s.channels));
  if (s.kernel <= 0 || s.kernel * s.kernel > 255 || s.stride <= 0 || s.padding < 0 || 2 * s.padding > s.kernel)
    throw std::runtime_error("max_pool: kernel " + std::to_string(s.kernel) + ", stride " + std::to_string(s.stride) +
                             ", padding " + std::to_string(s.padding) + " not supported");
}

// Whether a pooling is the one load_patch_outputs and patch_input_gradient take.
inline bool is_3x3_stride_2(const PoolShape& s) { return s.kernel == 3 && s.stride == 2 && s.padding == 1; }

}  // namespace ptrain::kernels::cuda
