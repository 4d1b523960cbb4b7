// A linear layer's bias gradient: the column sums of its output's gradient (column_sums.cuh), alone or in the
// pass that applies GELU's backward first, so that the gradient of the GELU's input is read once where LibTorch
// read it twice (gelu_backward, then the sum) and summed at the memory's speed. And GELU's forward with the amax
// of its output, for the FP8 cast that follows it (amax.cuh).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ptrain/kernels/cuda/amax.cuh"
#include "ptrain/kernels/cuda/column_sums.cuh"
#include "ptrain/kernels/cuda/elements.cuh"

namespace ptrain::kernels::cuda {

namespace {

constexpr int kColumns = column_sums::kColumns;

template <typename T>
struct GradientTerms {
  const T* grad;
  int64_t cols;
  __device__ __forceinline__ void operator()(int64_t row, int64_t col, float (&acc)[1][kColumns]) const {
    float g[kColumns];
    column_sums::load8(grad + row * cols + col, g);
#pragma unroll
    for (int i = 0; i < kColumns; ++i) acc[0][i] += g[i];
  }
};

// GELU's tanh approximation's constants, as LibTorch's: sqrt(2) * 2 / sqrt(pi) * 0.5 = sqrt(2 / pi), and kappa.
constexpr float kGeluBeta = static_cast<float>(1.41421356237309504880 * 1.12837916709551257390 * 0.5);
constexpr float kGeluKappa = 0.044715f;

// d/dh of GELU's tanh approximation, times dy: LibTorch's GeluBackward (tanh) in the same fp32 steps.
__device__ __forceinline__ float gelu_tanh_backward(float dy, float x) {
  const float x_sq = x * x;
  const float x_cube = x_sq * x;
  const float inner = kGeluBeta * (x + kGeluKappa * x_cube);
  const float tanh_inner = tanhf(inner);
  const float left = 0.5f * x;
  const float right = 1.0f + tanh_inner;
  const float left_derivative = 0.5f * right;
  const float tanh_derivative = 1.0f - tanh_inner * tanh_inner;
  const float inner_derivative = kGeluBeta * (1.0f + 3.0f * kGeluKappa * x_sq);
  const float right_derivative = left * tanh_derivative * inner_derivative;
  return dy * (left_derivative + right_derivative);
}

// GELU's tanh approximation: LibTorch's GeluCUDAKernelImpl (tanh) in the same fp32 steps.
__device__ __forceinline__ float gelu_tanh(float x) {
  const float x_cube = x * x * x;
  const float inner = kGeluBeta * (x + kGeluKappa * x_cube);
  return 0.5f * x * (1.0f + tanhf(inner));
}

constexpr int kGeluThreads = 256;
constexpr int kGeluMaxBlocks = 1024;  // grid-stride beyond: several blocks an SM on an H100 or H200

// out = fn(a, b) element for element (b may be null: fn(a, 0)), 16 bytes a load where every pointer is aligned to
// them (vectors), each result rounded to T, and the largest |out| as written into amax_bits (may be null).
template <typename T, typename Fn>
__global__ void elementwise_amax_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, int64_t n,
                                        bool vectors, unsigned int* __restrict__ amax_bits, Fn fn) {
  constexpr int kSize = Vec<T>::kSize;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float amax = 0.0f;
  int64_t tail = 0;
  if (vectors) {
    const int64_t chunks = n / kSize;
    for (int64_t i = first; i < chunks; i += stride) {
      float va[kSize], vb[kSize] = {};
      to_floats(reinterpret_cast<const Vec<T>*>(a)[i], va);
      if (b != nullptr) to_floats(reinterpret_cast<const Vec<T>*>(b)[i], vb);
#pragma unroll
      for (int k = 0; k < kSize; ++k) {
        va[k] = to_float(from_float<T>(fn(va[k], vb[k])));
        amax = abs_max(amax, va[k]);
      }
      reinterpret_cast<Vec<T>*>(out)[i] = from_floats<T>(va);
    }
    tail = chunks * kSize;
  }
  for (int64_t i = tail + first; i < n; i += stride) {
    const T v = from_float<T>(fn(to_float(a[i]), b != nullptr ? to_float(b[i]) : 0.0f));
    out[i] = v;
    amax = abs_max(amax, to_float(v));
  }
  if (amax_bits != nullptr) block_amax_into<kGeluThreads>(amax, amax_bits);
}

struct GeluForwardOp {
  __device__ __forceinline__ float operator()(float x, float) const { return gelu_tanh(x); }
};
struct GeluBackwardOp {  // a: the gradient, b: GELU's input
  __device__ __forceinline__ float operator()(float dy, float x) const { return gelu_tanh_backward(dy, x); }
};

template <typename T, typename Fn>
void launch_elementwise_amax(const void* a, const void* b, void* out, int64_t n, unsigned int* amax, Fn fn,
                             cudaStream_t stream) {
  const auto aligned = [](const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % sizeof(Vec<T>) == 0; };
  const bool vectors = aligned(a) && aligned(b) && aligned(out);
  const int64_t wanted = (n / Vec<T>::kSize + kGeluThreads - 1) / kGeluThreads;
  const auto blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(wanted, kGeluMaxBlocks)));
  elementwise_amax_kernel<T, Fn><<<blocks, kGeluThreads, 0, stream>>>(
      static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n, vectors, amax, fn);
}

// grad_input = grad * gelu'(h), written in T, and its values as written summed.
template <typename T>
struct GeluGradientTerms {
  const T* grad;
  const T* gelu_input;
  T* grad_input;
  int64_t cols;
  __device__ __forceinline__ void operator()(int64_t row, int64_t col, float (&acc)[1][kColumns]) const {
    const int64_t at = row * cols + col;
    float g[kColumns], h[kColumns], d[kColumns];
    column_sums::load8(grad + at, g);
    column_sums::load8(gelu_input + at, h);
#pragma unroll
    for (int i = 0; i < kColumns; ++i) d[i] = to_float(from_float<T>(gelu_tanh_backward(g[i], h[i])));
    column_sums::store8(grad_input + at, d);
#pragma unroll
    for (int i = 0; i < kColumns; ++i) acc[0][i] += d[i];
  }
};

}  // namespace

int64_t bias_gradient_workspace_floats(int64_t rows, int64_t cols) { return column_sums::workspace_floats(rows, cols); }

void bias_gradient(const BiasGradientShape& shape, const void* grad, void* grad_bias, float* workspace,
                   cudaStream_t stream) {
  with_type(shape.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const GradientTerms<T> terms{static_cast<const T*>(grad), shape.cols};
    column_sums::launch<1>("bias_gradient", terms, shape.rows, shape.cols, shape.bias_dtype, grad_bias, nullptr,
                           workspace, stream);
  });
}

void gelu_backward_bias_gradient(const BiasGradientShape& shape, const GeluBackwardIo& io, void* grad_bias,
                                 float* workspace, cudaStream_t stream) {
  with_type(shape.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const GeluGradientTerms<T> terms{static_cast<const T*>(io.grad), static_cast<const T*>(io.gelu_input),
                                     static_cast<T*>(io.grad_input), shape.cols};
    column_sums::launch<1>("gelu_backward_bias_gradient", terms, shape.rows, shape.cols, shape.bias_dtype, grad_bias,
                           nullptr, workspace, stream);
  });
}

void gelu_tanh_forward(Dtype dtype, const void* x, void* y, int64_t n, unsigned int* amax, cudaStream_t stream) {
  if (n <= 0) return;
  with_type(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_elementwise_amax<T>(x, nullptr, y, n, amax, GeluForwardOp{}, stream);
  });
  check_launch("gelu_tanh_forward");
}

void gelu_tanh_backward(Dtype dtype, const void* grad, const void* x, void* grad_x, int64_t n, unsigned int* amax,
                        cudaStream_t stream) {
  if (n <= 0) return;
  with_type(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    launch_elementwise_amax<T>(grad, x, grad_x, n, amax, GeluBackwardOp{}, stream);
  });
  check_launch("gelu_tanh_backward");
}

}  // namespace ptrain::kernels::cuda
