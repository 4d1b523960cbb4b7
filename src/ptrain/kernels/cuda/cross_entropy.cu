// Cross-entropy over a large vocabulary without fp32 logits (llm.c's fused classifier, split in two): the
// forward reads each row once (online softmax: running max and sum together) and keeps one float a row; the
// backward reads the row again and writes its gradient in the logits' dtype. LibTorch's path casts the
// logits to fp32, keeps fp32 log-probabilities for backward and reads them again for accuracy: for GPT-2's
// 50,257 classes about 40 bytes an element against these kernels' 6.
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "ptrain/kernels/cuda/elements.cuh"

namespace ptrain::kernels::cuda {

namespace {

// The softmax state of a part of a row: its largest value m and the sum of exp(x - m). A NaN anywhere makes
// the sum NaN, so a NaN logit gives a NaN loss, as LibTorch's path does.
struct SoftmaxState {
  float max;
  float sum;
};

__device__ __forceinline__ SoftmaxState combine(SoftmaxState a, SoftmaxState b) {
  if (a.max == -INFINITY && a.sum == 0.0f) return b;  // nothing seen yet
  if (b.max == -INFINITY && b.sum == 0.0f) return a;
  const float m = fmaxf(a.max, b.max);
  return {m, a.sum * __expf(a.max - m) + b.sum * __expf(b.max - m)};
}

// The first largest value of a part of a row, and where it is.
struct ArgMax {
  float value;
  int64_t index;
};

__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) {
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

constexpr int kWarp = 32;

// Calls fn(c, value) for every class of the row this block owns, each thread a share: 16-byte loads from
// the first 16-byte boundary of the row on (padded vocabularies keep every row aligned), scalar ones before
// it and after the last whole vector.
template <typename T, typename Fn>
__device__ __forceinline__ void for_each_class(const T* x, int64_t classes, Fn&& fn) {
  constexpr int V = 16 / sizeof(T);
  const auto address = reinterpret_cast<uintptr_t>(x);
  int64_t head = static_cast<int64_t>(((16 - address % 16) % 16) / sizeof(T));
  if (address % sizeof(T) != 0) head = classes;  // never for tensors LibTorch allocates
  head = head < classes ? head : classes;
  for (int64_t c = threadIdx.x; c < head; c += blockDim.x) fn(c, to_float(x[c]));
  const int64_t vectors = (classes - head) / V;
  const T* aligned = x + head;
  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
    struct alignas(16) Pack { T v[V]; };
    const Pack pack = reinterpret_cast<const Pack*>(aligned)[i];
#pragma unroll
    for (int k = 0; k < V; ++k) fn(head + i * V + k, to_float(pack.v[k]));
  }
  for (int64_t c = head + vectors * V + threadIdx.x; c < classes; c += blockDim.x) fn(c, to_float(x[c]));
}

template <typename T>
__global__ void cross_entropy_forward_kernel(const T* __restrict__ logits, int64_t classes, int64_t row_stride,
                                             const int64_t* __restrict__ labels, float* __restrict__ loss,
                                             float* __restrict__ lse_out, float* __restrict__ correct) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * row_stride;
  SoftmaxState state{-INFINITY, 0.0f};
  ArgMax arg{-INFINITY, classes};
  for_each_class(x, classes, [&](int64_t c, float v) {
    if (!(v <= state.max)) {  // larger, or NaN: a NaN max makes the row's sum NaN
      state.sum = state.sum * __expf(state.max - v) + 1.0f;
      state.max = v;
    } else if (v != -INFINITY) {
      state.sum += __expf(v - state.max);
    }
    if (v > arg.value) arg = {v, c};
  });
  // Within the warp, then across warps through shared memory.
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const SoftmaxState other{__shfl_xor_sync(0xffffffffu, state.max, offset),
                             __shfl_xor_sync(0xffffffffu, state.sum, offset)};
    state = combine(state, other);
    const ArgMax other_arg{__shfl_xor_sync(0xffffffffu, arg.value, offset),
                           __shfl_xor_sync(0xffffffffu, arg.index, offset)};
    arg = better(arg, other_arg);
  }
  __shared__ SoftmaxState states[kWarp];
  __shared__ ArgMax args[kWarp];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int warps = (blockDim.x + kWarp - 1) / kWarp;
  if (lane == 0) {
    states[warp] = state;
    args[warp] = arg;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < warps; ++w) {
      state = combine(state, states[w]);
      arg = better(arg, args[w]);
    }
    const float lse = state.max + logf(state.sum);
    const int64_t label = labels[row];
    const bool valid = label >= 0 && label < classes;
    loss[row] = valid ? lse - to_float(x[label]) : NAN;
    lse_out[row] = lse;
    correct[row] = valid && arg.index == label ? 1.0f : 0.0f;
  }
}

// Columns from classes to width (a padded vocabulary's) get a zero gradient.
template <typename T>
__global__ void cross_entropy_backward_kernel(const T* __restrict__ logits, int64_t classes, int64_t width,
                                              int64_t row_stride, const int64_t* __restrict__ labels,
                                              const float* __restrict__ lse, const float* __restrict__ scale,
                                              T* __restrict__ grad, int64_t grad_row_stride) {
  constexpr int V = 16 / sizeof(T);
  const int64_t row = blockIdx.x;
  const T* x = logits + row * row_stride;
  T* g = grad + row * grad_row_stride;
  const float row_lse = lse[row];
  const float s = *scale;
  const int64_t label = labels[row];
  const auto value = [&](int64_t c, float v) {
    if (c >= classes) return 0.0f;
    return (__expf(v - row_lse) - (c == label ? 1.0f : 0.0f)) * s;
  };
  struct alignas(16) Pack { T v[V]; };
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(g) % 16 == 0;
  const int64_t vectors = aligned ? width / V : 0;
  for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
    const Pack in = reinterpret_cast<const Pack*>(x)[i];
    Pack out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = from_float<T>(value(i * V + k, to_float(in.v[k])));
    reinterpret_cast<Pack*>(g)[i] = out;
  }
  for (int64_t c = vectors * V + threadIdx.x; c < width; c += blockDim.x) g[c] = from_float<T>(value(c, to_float(x[c])));
}

int threads_for(int64_t classes) {
  // One block a row: enough threads to cover the row several times over, in whole warps.
  if (classes >= 4096) return 1024;
  const int64_t warps = (classes + kWarp - 1) / kWarp;
  return static_cast<int>(warps * kWarp);
}

void check_rows(int64_t rows) {
  if (rows > 2147483647) throw std::runtime_error("cross_entropy: more than 2^31 - 1 rows");
}

}  // namespace

void cross_entropy_forward(const CrossEntropyLogits& in, float* loss, float* lse, float* correct, cudaStream_t stream) {
  const Dtype dtype = in.dtype;
  const void* logits = in.logits;
  const int64_t rows = in.rows, classes = in.classes, row_stride = in.row_stride;
  const int64_t* labels = in.labels;
  if (rows == 0) return;
  check_rows(rows);
  const dim3 grid(static_cast<unsigned>(rows)), block(threads_for(classes));
  switch (dtype) {
    case Dtype::kFloat:
      cross_entropy_forward_kernel<<<grid, block, 0, stream>>>(static_cast<const float*>(logits), classes, row_stride,
                                                               labels, loss, lse, correct);
      break;
    case Dtype::kHalf:
      cross_entropy_forward_kernel<<<grid, block, 0, stream>>>(static_cast<const __half*>(logits), classes, row_stride,
                                                               labels, loss, lse, correct);
      break;
    case Dtype::kBFloat16:
      cross_entropy_forward_kernel<<<grid, block, 0, stream>>>(static_cast<const __nv_bfloat16*>(logits), classes,
                                                               row_stride, labels, loss, lse, correct);
      break;
  }
  check_launch("cross_entropy_forward");
}

void cross_entropy_backward(const CrossEntropyLogits& in, int64_t width, const float* lse, const float* scale,
                            void* grad, int64_t grad_row_stride, cudaStream_t stream) {
  const Dtype dtype = in.dtype;
  const void* logits = in.logits;
  const int64_t rows = in.rows, classes = in.classes, row_stride = in.row_stride;
  const int64_t* labels = in.labels;
  if (rows == 0) return;
  check_rows(rows);
  const dim3 grid(static_cast<unsigned>(rows)), block(threads_for(classes));
  switch (dtype) {
    case Dtype::kFloat:
      cross_entropy_backward_kernel<<<grid, block, 0, stream>>>(static_cast<const float*>(logits), classes, width,
                                                                row_stride, labels, lse, scale,
                                                                static_cast<float*>(grad), grad_row_stride);
      break;
    case Dtype::kHalf:
      cross_entropy_backward_kernel<<<grid, block, 0, stream>>>(static_cast<const __half*>(logits), classes,
                                                                width, row_stride, labels, lse, scale,
                                                                static_cast<__half*>(grad), grad_row_stride);
      break;
    case Dtype::kBFloat16:
      cross_entropy_backward_kernel<<<grid, block, 0, stream>>>(static_cast<const __nv_bfloat16*>(logits), classes,
                                                                width, row_stride, labels, lse, scale,
                                                                static_cast<__nv_bfloat16*>(grad), grad_row_stride);
      break;
  }
  check_launch("cross_entropy_backward");
}

}  // namespace ptrain::kernels::cuda
