// Max pooling over NHWC activations (ResNet's stem: 3x3, stride 2, padding 1 over 64 channels at 112x112),
// keeping for the backward the position of each output's maximum within its window as one byte, where
// LibTorch keeps an int64 index into the whole plane: 205 MB of indices for ResNet-50 at batch 128 become 26 MB,
// and its NHWC kernels, which reach 0.6 TB/s on an H200 with them, become bandwidth-bound.
// Same numbers as LibTorch's kernels: the first largest value of the window in row-major order (a NaN wins,
// the last one seen), and in the backward each input sums, in fp32 and in LibTorch's order (output rows, then
// columns), the gradients of the outputs whose maximum it was. (Built with fast math, as the folder is: fp32 and
// bf16 subnormals compare as zero, so among ties of such values the first wins.)
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "ptrain/kernels/cuda/pooling.cuh"

namespace ptrain::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// One thread per output pixel and channel vector. Index: int when every index fits, as for ResNet's stem,
// since each thread splits its index by divisions, which take many more instructions in 64 bits (ResNet-50 at
// batch 128 on an H200: the forward went from 147 to 133 us, the backward from 347 to 276).
template <typename T, typename Index>
__global__ void max_pool_forward_kernel(const T* __restrict__ x, PoolShape s, T* __restrict__ y,
                                        uint8_t* __restrict__ positions) {
  constexpr int V = Vec<T>::kSize;
  const Index groups = static_cast<Index>(s.channels / V);
  const Index out_h = static_cast<Index>(s.out_h), out_w = static_cast<Index>(s.out_w);
  const Index total = static_cast<Index>(s.batch * s.out_h * s.out_w * groups);
  for (Index i = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const VectorAt<Index> pos = vector_at(i, groups, out_h, out_w);  // (n, oh, ow)
    const Index g = pos.group, pixel = pos.pixel, oh = pos.h, ow = pos.w, n = pos.n;
    float best[V];
    Positions<V> where;
    window_maximum<T, Index>(x, s, n, oh, ow, g, [](int, T v) { return to_float(v); }, best, where);
    Vec<T> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = from_float<T>(best[k]);
    const int64_t at = static_cast<int64_t>(pixel) * s.channels + g * V;
    *reinterpret_cast<Vec<T>*>(y + at) = out;
    *reinterpret_cast<Positions<V>*>(positions + at) = where;
  }
}

// One thread per input pixel and channel vector: the outputs whose window holds it, in LibTorch's order.
// Span > 0: at most Span outputs a direction hold an input (ceil(kernel / stride): 2 for ResNet's 3x3 stride-2
// pool), so the loops unroll and every load is issued before the first is used (276 to 258 us, as above); 0:
// any geometry.
template <typename T, typename Index, int Span>
__global__ void max_pool_backward_kernel(const T* __restrict__ dy, const uint8_t* __restrict__ positions, PoolShape s,
                                         T* __restrict__ dx) {
  constexpr int V = Vec<T>::kSize;
  const Index groups = static_cast<Index>(s.channels / V);
  const Index in_h = static_cast<Index>(s.in_h), in_w = static_cast<Index>(s.in_w);
  const Index out_h = static_cast<Index>(s.out_h), out_w = static_cast<Index>(s.out_w);
  const Index total = static_cast<Index>(s.batch * s.in_h * s.in_w * groups);
  for (Index i = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const VectorAt<Index> pos = vector_at(i, groups, in_h, in_w);  // (n, ih, iw)
    const Index g = pos.group, pixel = pos.pixel, ih = pos.h, iw = pos.w, n = pos.n;
    // Outputs oh with oh * stride - padding <= ih < oh * stride - padding + kernel.
    const Index oh_begin = ih + s.padding < s.kernel ? 0 : (ih + s.padding - s.kernel) / s.stride + 1;
    const Index oh_end = min(static_cast<Index>((ih + s.padding) / s.stride + 1), out_h);
    const Index ow_begin = iw + s.padding < s.kernel ? 0 : (iw + s.padding - s.kernel) / s.stride + 1;
    const Index ow_end = min(static_cast<Index>((iw + s.padding) / s.stride + 1), out_w);
    float sum[V];
#pragma unroll
    for (int k = 0; k < V; ++k) sum[k] = 0.0f;
    const auto add = [&](Index oh, Index ow) {
      const int64_t at = ((static_cast<int64_t>(n) * s.out_h + oh) * s.out_w + ow) * s.channels + g * V;
      const uint8_t mine = static_cast<uint8_t>((ih - (oh * s.stride - s.padding)) * s.kernel +
                                                (iw - (ow * s.stride - s.padding)));
      const Positions<V> where = *reinterpret_cast<const Positions<V>*>(positions + at);
      const Vec<T> grad = *reinterpret_cast<const Vec<T>*>(dy + at);
#pragma unroll
      for (int k = 0; k < V; ++k)
        if (where.p[k] == mine) sum[k] += to_float(grad.v[k]);
    };
    if constexpr (Span > 0) {
#pragma unroll
      for (int a = 0; a < Span; ++a) {
#pragma unroll
        for (int b = 0; b < Span; ++b) {
          if (oh_begin + a < oh_end && ow_begin + b < ow_end) add(oh_begin + a, ow_begin + b);
        }
      }
    } else {
      for (Index oh = oh_begin; oh < oh_end; ++oh) {
        for (Index ow = ow_begin; ow < ow_end; ++ow) add(oh, ow);
      }
    }
    Vec<T> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = from_float<T>(sum[k]);
    *reinterpret_cast<Vec<T>*>(dx + static_cast<int64_t>(pixel) * s.channels + g * V) = out;
  }
}

// The 3x3, stride-2, padding-1 pooling of ResNet's stem, one thread per output pixel and channel vector, which
// writes the 2x2 patch of inputs it owns (pooling.cuh: load_patch_outputs). Per input, the kernel above loads up to
// four outputs to write one and splits every index by divisions: 258 us for ResNet-50's stem at batch 128 on an
// H200, about 3.5x what its bytes take.
template <typename T, typename Index>
__global__ void max_pool_backward_3x3s2_kernel(const T* __restrict__ dy, const uint8_t* __restrict__ positions,
                                               PoolShape s, T* __restrict__ dx) {
  constexpr int V = Vec<T>::kSize;
  const Index groups = static_cast<Index>(s.channels / V);
  const Index out_h = static_cast<Index>(s.out_h), out_w = static_cast<Index>(s.out_w);
  const Index in_h = static_cast<Index>(s.in_h), in_w = static_cast<Index>(s.in_w);
  const Index total = static_cast<Index>(s.batch * s.out_h * s.out_w * groups);
  for (Index i = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const VectorAt<Index> pos = vector_at(i, groups, out_h, out_w);  // (n, oh, ow)
    const Index g = pos.group, oh = pos.h, ow = pos.w, n = pos.n;
    const PatchOutputs<T> outputs = load_patch_outputs<T, Index>(dy, positions, s, n, oh, ow, g);
#pragma unroll
    for (int a = 0; a < 2; ++a) {
      const Index ih = 2 * oh + a;
      if (ih >= in_h) continue;
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const Index iw = 2 * ow + b;
        if (iw >= in_w) continue;
        float sum[V];
        patch_input_gradient(outputs, a, b, sum);
        const int64_t at = ((static_cast<int64_t>(n) * s.in_h + ih) * s.in_w + iw) * s.channels + g * V;
        *reinterpret_cast<Vec<T>*>(dx + at) = from_floats<T>(sum);
      }
    }
  }
}

unsigned blocks_for(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

// Whether the kernels' indices (vectors, pixels, rows and columns, and the grid-stride loop past the last
// vector) fit an int.
bool fits_int(int64_t total, const PoolShape& s) {
  const int64_t limit = std::numeric_limits<int>::max() - static_cast<int64_t>(65535) * 16 * kThreads;
  return total < limit && s.batch * s.in_h * s.in_w < limit && s.batch * s.out_h * s.out_w < limit;
}

}  // namespace

void max_pool_forward(Dtype dtype, const void* x, const PoolShape& shape, void* y, uint8_t* positions,
                      cudaStream_t stream) {
  check_pool(dtype, shape);
  const int64_t total = shape.batch * shape.out_h * shape.out_w * (shape.channels / vector_elements(dtype));
  if (total == 0) return;
  with_type(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (fits_int(total, shape))
      max_pool_forward_kernel<T, int><<<blocks_for(total), kThreads, 0, stream>>>(static_cast<const T*>(x), shape,
                                                                                static_cast<T*>(y), positions);
    else
      max_pool_forward_kernel<T, int64_t><<<blocks_for(total), kThreads, 0, stream>>>(static_cast<const T*>(x), shape,
                                                                                    static_cast<T*>(y), positions);
  });
  check_launch("max_pool_forward");
}

void max_pool_backward(Dtype dtype, const void* dy, const uint8_t* positions, const PoolShape& shape, void* dx,
                       cudaStream_t stream) {
  check_pool(dtype, shape);
  const int64_t total = shape.batch * shape.in_h * shape.in_w * (shape.channels / vector_elements(dtype));
  if (total == 0) return;
  with_type(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto* grad = static_cast<const T*>(dy);
    auto* out = static_cast<T*>(dx);
    const bool span2 = (shape.kernel + shape.stride - 1) / shape.stride <= 2;
    const bool stem = is_3x3_stride_2(shape);
    const int64_t outputs = shape.batch * shape.out_h * shape.out_w * (shape.channels / vector_elements(dtype));
    if (fits_int(total, shape) && stem)
      max_pool_backward_3x3s2_kernel<T, int><<<blocks_for(outputs), kThreads, 0, stream>>>(grad, positions, shape, out);
    else if (fits_int(total, shape) && span2)
      max_pool_backward_kernel<T, int, 2><<<blocks_for(total), kThreads, 0, stream>>>(grad, positions, shape, out);
    else if (fits_int(total, shape))
      max_pool_backward_kernel<T, int, 0><<<blocks_for(total), kThreads, 0, stream>>>(grad, positions, shape, out);
    else
      max_pool_backward_kernel<T, int64_t, 0><<<blocks_for(total), kThreads, 0, stream>>>(grad, positions, shape, out);
  });
  check_launch("max_pool_backward");
}

}  // namespace ptrain::kernels::cuda
