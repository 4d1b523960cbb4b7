// Residual add + LayerNorm for the transformer block, forward and backward. Under autocast LibTorch's path
// adds the branch to the fp32 residual stream (one pass), normalises in fp32 (another) and the next matrix
// product casts the result to bf16 (a third); its backward adds the two gradients of the sum, and reduces
// weight and bias gradients at a quarter of the memory bandwidth. Here: one row kernel each way (a warp a
// row; the forward reads its row twice, the second time from L1, the backward holds rows of up to 2,048 columns in
// registers) that writes the normalised row straight in the compute dtype, and column sums (column_sums.cuh) for
// the weight and bias gradients.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "ptrain/kernels/cuda/amax.cuh"
#include "ptrain/kernels/cuda/column_sums.cuh"
#include "ptrain/kernels/cuda/elements.cuh"

namespace ptrain::kernels::cuda {

namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;  // 256 threads

template <typename T>
struct alignas(4 * sizeof(T)) Four {
  T v[4];
};

template <typename T>
__device__ __forceinline__ void load4(const T* p, float* out) {
  const Four<T> f = *reinterpret_cast<const Four<T>*>(p);
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = to_float(f.v[i]);
}

template <typename T>
__device__ __forceinline__ void store4(T* p, const float* in) {
  Four<T> f;
#pragma unroll
  for (int i = 0; i < 4; ++i) f.v[i] = from_float<T>(in[i]);
  *reinterpret_cast<Four<T>*>(p) = f;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// One row of forward_kernel, by one warp; returns this lane's largest |out| as written (0 unless with_amax).
template <typename B, typename Y>
__device__ __forceinline__ float forward_row(const float* __restrict__ x, const B* __restrict__ branch,
                                             const float* __restrict__ weight, const float* __restrict__ bias,
                                             int64_t row, int64_t cols, float eps, float* __restrict__ sum,
                                             Y* __restrict__ out, float* __restrict__ mean_out,
                                             float* __restrict__ rstd_out, bool with_amax) {
  const int lane = threadIdx.x % kWarp;
  const float* xr = x + row * cols;
  float* sr = sum ? sum + row * cols : nullptr;
  // Pass 1: the sum (written when there is a branch) and its mean and variance (Welford within the lane).
  float mean = 0.0f, m2 = 0.0f, n = 0.0f;
  for (int64_t j = lane * 4; j < cols; j += kWarp * 4) {
    float v[4];
    load4(xr + j, v);
    if (branch) {
      float b[4];
      load4(branch + row * cols + j, b);
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] += b[i];
      store4(sr + j, v);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      n += 1.0f;
      const float delta = v[i] - mean;
      mean += delta / n;
      m2 += delta * (v[i] - mean);
    }
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const float nb = __shfl_xor_sync(0xffffffffu, n, offset);
    const float mb = __shfl_xor_sync(0xffffffffu, mean, offset);
    const float m2b = __shfl_xor_sync(0xffffffffu, m2, offset);
    const float total = n + nb;
    if (total > 0.0f) {
      const float delta = mb - mean;
      mean += delta * nb / total;
      m2 += m2b + delta * delta * n * nb / total;
    }
    n = total;
  }
  const float rstd = rsqrtf(m2 / n + eps);
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
  // Pass 2: normalise what pass 1 read or wrote (in L1 by now).
  const float* in = branch ? sr : xr;
  float amax = 0.0f;
  for (int64_t j = lane * 4; j < cols; j += kWarp * 4) {
    float v[4], w[4], b[4];
    load4(in + j, v);
    load4(weight + j, w);
    load4(bias + j, b);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = (v[i] - mean) * rstd * w[i] + b[i];
    store4(out + row * cols + j, v);
    if (with_amax) {
#pragma unroll
      for (int i = 0; i < 4; ++i) amax = abs_max(amax, to_float(from_float<Y>(v[i])));
    }
  }
  return amax;
}

// Branch type B (ignored without a branch), output type Y. out_amax (may be null): the largest |out| as written
// (launch.h: AddLayerNormForwardIo).
template <typename B, typename Y>
__global__ void forward_kernel(const float* __restrict__ x, const B* __restrict__ branch, const float* __restrict__ weight,
                               const float* __restrict__ bias, int64_t rows, int64_t cols, float eps,
                               float* __restrict__ sum, Y* __restrict__ out, float* __restrict__ mean_out,
                               float* __restrict__ rstd_out, unsigned int* __restrict__ out_amax) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  // Every thread of the block joins the amax's reduction, a row past the last included.
  const float amax = row < rows ? forward_row(x, branch, weight, bias, row, cols, eps, sum, out, mean_out, rstd_out,
                                              out_amax != nullptr)
                                : 0.0f;
  if (out_amax != nullptr) block_amax_into<kRowsPerBlock * kWarp>(amax, out_amax);
}

// Output-gradient type Y, branch type B.
template <typename Y, typename B>
__global__ void backward_rows_kernel(const Y* __restrict__ grad_out, const float* __restrict__ grad_sum,
                                     const float* __restrict__ input, const float* __restrict__ mean,
                                     const float* __restrict__ rstd, const float* __restrict__ weight, int64_t rows,
                                     int64_t cols, float* __restrict__ grad_input, B* __restrict__ grad_branch) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const float mu = mean[row], rs = rstd[row];
  const int64_t base = row * cols;
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int64_t j = lane * 4; j < cols; j += kWarp * 4) {
    float dy[4], v[4], w[4];
    load4(grad_out + base + j, dy);
    load4(input + base + j, v);
    load4(weight + j, w);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float g = dy[i] * w[i];
      sum_g += g;
      sum_gx += g * (v[i] - mu) * rs;
    }
  }
  const float mean_g = warp_sum(sum_g) / static_cast<float>(cols);
  const float mean_gx = warp_sum(sum_gx) / static_cast<float>(cols);
  for (int64_t j = lane * 4; j < cols; j += kWarp * 4) {
    float dy[4], v[4], w[4], d[4];
    load4(grad_out + base + j, dy);
    load4(input + base + j, v);
    load4(weight + j, w);
    float extra[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (grad_sum) load4(grad_sum + base + j, extra);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float xhat = (v[i] - mu) * rs;
      d[i] = rs * (dy[i] * w[i] - mean_g - xhat * mean_gx) + extra[i];
    }
    store4(grad_input + base + j, d);
    if (grad_branch) store4(grad_branch + base + j, d);
  }
}

// A lane's columns in the backward that holds a row in registers: groups of 8 (16 bytes of a 16-bit dtype), group k
// at (k * 32 + lane) * 8, up to kMaxResidentGroups groups (2,048 columns: GPT-2 XL's 1,600 take 7).
constexpr int kResidentColumns = 8;
constexpr int kMaxResidentGroups = 8;

// The backward with the row held in registers between the two passes (rows of up to kMaxResidentGroups * 256
// columns): each lane loads its groups at once, so that a warp has all its row's loads in flight, and the second
// pass reads nothing but grad_sum. On an H100 (gpt_block_bench, 8192 rows) the whole backward took 111 us at
// GPT-2 large's 1,280 columns against backward_rows_kernel's 124, 143 against 159 at XL's 1,600. The forward's
// resident twin was slower than forward_kernel (63 against 52 us: the second read hits L1), so the forward keeps
// reading its row twice.
template <typename Y, typename B, int kGroups>
__global__ void __launch_bounds__(kRowsPerBlock * kWarp) backward_rows_resident_kernel(
    const Y* __restrict__ grad_out, const float* __restrict__ grad_sum, const float* __restrict__ input,
    const float* __restrict__ mean, const float* __restrict__ rstd, const float* __restrict__ weight, int64_t rows,
    int64_t cols, float* __restrict__ grad_input, B* __restrict__ grad_branch) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const float mu = mean[row], rs = rstd[row];
  const int64_t base = row * cols;
  float g[kGroups][kResidentColumns], xhat[kGroups][kResidentColumns];
  float sum_g = 0.0f, sum_gx = 0.0f;
#pragma unroll
  for (int k = 0; k < kGroups; ++k) {
    const int64_t j = (static_cast<int64_t>(k) * kWarp + lane) * kResidentColumns;
    if (j < cols) {
      float dy[kResidentColumns], v[kResidentColumns], w[kResidentColumns];
      column_sums::load8(grad_out + base + j, dy);
      column_sums::load8(input + base + j, v);
      column_sums::load8(weight + j, w);
#pragma unroll
      for (int i = 0; i < kResidentColumns; ++i) {
        g[k][i] = dy[i] * w[i];
        xhat[k][i] = (v[i] - mu) * rs;
        sum_g += g[k][i];
        sum_gx += g[k][i] * xhat[k][i];
      }
    }
  }
  const float mean_g = warp_sum(sum_g) / static_cast<float>(cols);
  const float mean_gx = warp_sum(sum_gx) / static_cast<float>(cols);
#pragma unroll
  for (int k = 0; k < kGroups; ++k) {
    const int64_t j = (static_cast<int64_t>(k) * kWarp + lane) * kResidentColumns;
    if (j >= cols) continue;
    float extra[kResidentColumns] = {}, d[kResidentColumns];
    if (grad_sum) column_sums::load8(grad_sum + base + j, extra);
#pragma unroll
    for (int i = 0; i < kResidentColumns; ++i) d[i] = rs * (g[k][i] - mean_g - xhat[k][i] * mean_gx) + extra[i];
    column_sums::store8(grad_input + base + j, d);
    if (grad_branch) column_sums::store8(grad_branch + base + j, d);
  }
}

// Calls fn with std::integral_constant<int, groups> for groups in [1, kMaxResidentGroups].
template <typename Fn>
void with_groups(int groups, Fn&& fn) {
  switch (groups) {
    case 1: fn(std::integral_constant<int, 1>{}); break;
    case 2: fn(std::integral_constant<int, 2>{}); break;
    case 3: fn(std::integral_constant<int, 3>{}); break;
    case 4: fn(std::integral_constant<int, 4>{}); break;
    case 5: fn(std::integral_constant<int, 5>{}); break;
    case 6: fn(std::integral_constant<int, 6>{}); break;
    case 7: fn(std::integral_constant<int, 7>{}); break;
    default: fn(std::integral_constant<int, 8>{}); break;
  }
}

// The weight and bias gradients' terms of a row: dy * xhat and dy, for column_sums (two sums).
template <typename Y>
struct ParamGradTerms {
  const Y* grad_out;
  const float* input;
  const float* mean;
  const float* rstd;
  int64_t cols;
  __device__ __forceinline__ void operator()(int64_t row, int64_t col, float (&acc)[2][column_sums::kColumns]) const {
    float dy[column_sums::kColumns], v[column_sums::kColumns];
    column_sums::load8(grad_out + row * cols + col, dy);
    column_sums::load8(input + row * cols + col, v);
    const float mu = mean[row], rs = rstd[row];
#pragma unroll
    for (int i = 0; i < column_sums::kColumns; ++i) {
      acc[0][i] += dy[i] * (v[i] - mu) * rs;
      acc[1][i] += dy[i];
    }
  }
};

void check_shape(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0 || cols % 8 != 0)
    throw std::runtime_error("layer_norm: cols must be a positive multiple of 8, got " + std::to_string(cols));
}

}  // namespace

void add_layer_norm_forward(const LayerNormShape& shape, const AddLayerNormForwardIo& io, const float* weight,
                            const float* bias, double eps, cudaStream_t stream) {
  const int64_t rows = shape.rows, cols = shape.cols;
  check_shape(rows, cols);
  const unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  with_type(shape.branch_dtype, [&](auto* b_tag) {
    using B = std::remove_pointer_t<decltype(b_tag)>;
    with_type(shape.out_dtype, [&](auto* y_tag) {
      using Y = std::remove_pointer_t<decltype(y_tag)>;
      forward_kernel<B, Y><<<blocks, kRowsPerBlock * kWarp, 0, stream>>>(
          io.x, static_cast<const B*>(io.branch), weight, bias, rows, cols, static_cast<float>(eps), io.sum,
          static_cast<Y*>(io.out), io.mean, io.rstd, io.out_amax);
    });
  });
  check_launch("add_layer_norm_forward");
}

int64_t layer_norm_workspace_floats(int64_t rows, int64_t cols) { return 2 * column_sums::workspace_floats(rows, cols); }

void add_layer_norm_backward(const LayerNormShape& shape, const AddLayerNormBackwardIo& io, const float* weight,
                             float* grad_weight, float* grad_bias, float* workspace, cudaStream_t stream) {
  const int64_t rows = shape.rows, cols = shape.cols;
  const void* grad_out = io.grad_out;
  const float *input = io.input, *mean = io.mean, *rstd = io.rstd;
  check_shape(rows, cols);
  const unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  with_type(shape.out_dtype, [&](auto* y_tag) {
    using Y = std::remove_pointer_t<decltype(y_tag)>;
    with_type(shape.branch_dtype, [&](auto* b_tag) {
      using B = std::remove_pointer_t<decltype(b_tag)>;
      const int64_t groups = (cols + kWarp * kResidentColumns - 1) / (kWarp * kResidentColumns);
      if (groups > kMaxResidentGroups) {
        backward_rows_kernel<Y, B><<<blocks, kRowsPerBlock * kWarp, 0, stream>>>(
            static_cast<const Y*>(grad_out), io.grad_sum, input, mean, rstd, weight, rows, cols, io.grad_input,
            static_cast<B*>(io.grad_branch));
        return;
      }
      with_groups(static_cast<int>(groups), [&](auto g) {
        backward_rows_resident_kernel<Y, B, decltype(g)::value><<<blocks, kRowsPerBlock * kWarp, 0, stream>>>(
            static_cast<const Y*>(grad_out), io.grad_sum, input, mean, rstd, weight, rows, cols, io.grad_input,
            static_cast<B*>(io.grad_branch));
      });
    });
    const ParamGradTerms<Y> terms{static_cast<const Y*>(grad_out), input, mean, rstd, cols};
    column_sums::launch<2>("add_layer_norm_backward (weight and bias)", terms, rows, cols, Dtype::kFloat, grad_weight,
                           grad_bias, workspace, stream);
  });
  check_launch("add_layer_norm_backward");
}

}  // namespace ptrain::kernels::cuda
