// What the kernels of this folder share: element types to fp32 and back (round to nearest even), 16-byte
// vectors of elements, dispatch on Dtype, and the check after a launch. Included by the .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "ptrain/kernels/cuda/launch.h"

namespace ptrain::kernels::cuda {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// kSize elements of T in one 16-byte load or store.
template <typename T>
struct alignas(16) Vec {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

// A Vec's elements as fp32 (add_floats: added to out), and back, each rounded to nearest even.
template <typename T>
__device__ __forceinline__ void to_floats(const Vec<T>& in, float* out) {
#pragma unroll
  for (int i = 0; i < Vec<T>::kSize; ++i) out[i] = to_float(in.v[i]);
}

template <typename T>
__device__ __forceinline__ void add_floats(const Vec<T>& in, float* out) {
#pragma unroll
  for (int i = 0; i < Vec<T>::kSize; ++i) out[i] += to_float(in.v[i]);
}

template <typename T>
__device__ __forceinline__ Vec<T> from_floats(const float* in) {
  Vec<T> out;
#pragma unroll
  for (int i = 0; i < Vec<T>::kSize; ++i) out.v[i] = from_float<T>(in[i]);
  return out;
}

// PyTorch's ReLU, NaN kept: fmaxf(NaN, 0) is 0, which would hide a diverged activation from the loss.
__device__ __forceinline__ float relu_of(float v) { return v > 0.0f || isnan(v) ? v : 0.0f; }

// The elements of a Vec of dtype: 4 in fp32, 8 in fp16 and bf16.
inline int vector_elements(Dtype dtype) { return dtype == Dtype::kFloat ? 4 : 8; }

// Calls fn with a null pointer of the C++ type of dtype, to dispatch templates.
template <typename Fn>
void with_type(Dtype dtype, Fn&& fn) {
  switch (dtype) {
    case Dtype::kFloat: fn(static_cast<float*>(nullptr)); break;
    case Dtype::kHalf: fn(static_cast<__half*>(nullptr)); break;
    case Dtype::kBFloat16: fn(static_cast<__nv_bfloat16*>(nullptr)); break;
  }
}

// Throws std::runtime_error naming the kernel when its launch failed.
inline void check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw std::runtime_error(std::string(kernel) + ": " + cudaGetErrorString(status));
}

}  // namespace ptrain::kernels::cuda
