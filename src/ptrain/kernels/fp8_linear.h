// Linear layers with their matrix products in FP8 (--precision fp8), as torchao's Float8Linear with
// tensorwise dynamic scaling: each operand is scaled by its own amax into the FP8 range and cast, and
// cuBLASLt's FP8 GEMM (at::_scaled_mm) multiplies the results back by the inverse scales.
//   forward    y       = x (E4M3) @ w (E4M3)^T + bias           -> bf16 (the bias in the GEMM's epilogue)
//   backward   grad_x  = grad_y (E5M2) @ w (E4M3)               -> x's dtype
//              grad_w  = grad_y (E5M2)^T @ x (E4M3)             -> w's dtype (fp32 master weights)
// E4M3 (3 mantissa bits, largest 448) for activations and weights, E5M2 (2 bits, largest 57344) for the
// gradients, whose range matters more than their precision. The backward reuses the forward's FP8 x and w,
// kept in the transposed layouts its products take: what is saved for it is one byte an element. Scales never
// leave the device (no host sync: the step is captured as a CUDA graph). Here rather than in precision/ because
// models/ calls it and may use kernels/ only.
#pragma once

#include <torch/torch.h>

#include "ptrain/kernels/fused.h"

namespace ptrain::kernels {

// A tensor cast to FP8 with its tensorwise scale: data = fp8(clamp(x * scale, +-fp8_max)); the matrix
// products take inv_scale = 1 / scale. scale and inv_scale are fp32 one-element tensors on x's device.
// transposed and column_sums where asked for (fused.h: Fp8CastExtras): data viewed as [rows, last dimension],
// transposed and stored row-major; x's column sums in fp32.
using fused::Fp8AmaxHistory;
using fused::Fp8CastExtras;
struct Fp8Tensor {
  torch::Tensor data, scale, inv_scale, transposed, column_sums;
};

// The cast on LibTorch ops: amax = |x|.max(), scale = fp8_max / max(amax, 1e-12) (torchao's EPS), data as above
// rounded to nearest even. The reference the fused kernel (fused.h: fp8_cast) must match bit for bit.
Fp8Tensor reference_fp8_cast(const torch::Tensor& x, bool e5m2, Fp8CastExtras extras = {});
// The same on the fused kernel (two passes over x instead of five) where the device has fused kernels and
// allow_fused is set; else the reference. With extras.delayed, the scale comes from its history (see
// Fp8LinearHistories below), x's amax is recorded in it, and the returned scale is the history's.
// The extras need x's rows and last dimension to be multiples of 16 (as fp8_linear_applies requires).
Fp8Tensor fp8_cast(const torch::Tensor& x, bool e5m2, bool allow_fused, Fp8CastExtras extras = {});

// Whether fp8_linear multiplies in FP8 here: this LibTorch has FP8 products, x [..., in] and weight [out, in] are
// on a CUDA device in fp32/fp16/bf16, and rows (x's elements / in), in and out are multiples of 16
// (cuBLASLt's FP8 GEMMs need them); the shape condition alone is fp8_shape_applies.
bool fp8_shape_applies(int64_t rows, int64_t in, int64_t out);
bool fp8_linear_applies(const torch::Tensor& x, const torch::Tensor& weight);

// Delayed scaling (--fp8-scaling delayed) for one layer: an amax history for its input, its weight and its
// output gradient (fused.h: Fp8AmaxHistory). Each cast takes its scale from the largest amax of its role's last
// history_len casts and records its own amax for the next (Transformer Engine's DelayedScaling, amax_compute_algo
// "max"): no amax pass before each cast; values beyond the recent range saturate. The first cast of each role
// scales by its own amax. The states live on the device the layer first runs on, allocated there before a CUDA
// graph captures the step; they are not checkpointed (a resumed run starts its histories again).
struct Fp8LinearHistories : torch::CustomClassHolder {
  explicit Fp8LinearHistories(int64_t history_len);
  void allocate_on(const torch::Device& device);  // zeros, unless already there
  int64_t history_len;
  Fp8AmaxHistory input, weight, grad_output;
};
// TorchAO's and Transformer Engine's choices lie between 16 and 1024; 16 follows a changing range sooner.
constexpr int64_t kFp8AmaxHistory = 16;

// x @ weight^T + bias (bias may be undefined), with the product in FP8 where fp8_linear_applies, the output in
// bf16; elsewhere LibTorch's linear under the caller's autocast (bf16 with --precision fp8). allow_fused: the
// casts on the fused kernel. delayed (null: dynamic scaling): the layer's amax histories. x_amax (may be
// undefined): x's amax as the kernel that wrote x took it (fused.h: fp8_amax_stats; AddLayerNorm::out_amax,
// Fp8Activation::amax), which x's fused cast takes instead of a pass of its own under dynamic scaling.
// Differentiable in x, weight and bias.
torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                         bool allow_fused, const c10::intrusive_ptr<Fp8LinearHistories>& delayed = {},
                         const torch::Tensor& x_amax = {});

// GELU (tanh approximation) of an FP8 linear's output h, for the next FP8 linear: on the fused kernel (allow_fused,
// h on a device with fused kernels) its amax comes from the pass that writes it; elsewhere LibTorch's gelu and no
// amax. The values and the backward (LibTorch's gelu_backward) are LibTorch's.
struct Fp8Activation {
  torch::Tensor y, amax;
};
Fp8Activation gelu_tanh_for_fp8(const torch::Tensor& h, bool allow_fused);

// gelu(fp8_linear(x, weight, bias)) as one function, so that its backward applies GELU's backward on the fused kernel
// with the amax of what it writes, which the cast of the product's gradient takes instead of a pass of its own (under
// dynamic scaling). y as gelu_tanh_for_fp8 returns it, with its amax where the fused kernels ran. Elsewhere (shapes
// fp8_linear_applies refuses) LibTorch's linear and gelu_tanh_for_fp8.
Fp8Activation fp8_linear_gelu(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                              bool allow_fused, const c10::intrusive_ptr<Fp8LinearHistories>& delayed = {},
                              const torch::Tensor& x_amax = {});

}  // namespace ptrain::kernels
