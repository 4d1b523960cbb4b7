// The fused kernels at the level of tensors, behind the public functions of this folder (cross_entropy.h,
// ...), which choose between them and the LibTorch reference. CUDA builds define these in fused_cuda.cpp
// (on the kernels of cuda/); CPU builds in fused_none.cpp, where available() is false.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "ptrain/kernels/batch_norm_params.h"

namespace ptrain::kernels::fused {

// Whether this build has fused kernels for tensors on device.
bool available(const torch::Device& device);

// The element types the kernels are written for.
inline bool kernel_dtype(torch::ScalarType t) { return t == torch::kFloat || t == torch::kHalf || t == torch::kBFloat16; }

// Whether the NHWC kernels (batch norm, max pooling) take x as rows of 16-byte channel vectors: a non-empty
// channels-last [N, C, H, W] tensor of a kernel dtype on a device with fused kernels, C a multiple of 8 (4 in
// fp32).
inline bool nhwc_vectors(const torch::Tensor& x) {
  if (!available(x.device()) || x.dim() != 4 || !kernel_dtype(x.scalar_type())) return false;
  if (!x.is_contiguous(at::MemoryFormat::ChannelsLast) || x.numel() == 0) return false;
  return x.size(1) % (x.scalar_type() == torch::kFloat ? 4 : 8) == 0;
}

struct CrossEntropyRows {
  torch::Tensor loss;     // [rows] fp32
  torch::Tensor lse;      // [rows] fp32, log-sum-exp of each row: what the backward needs
  torch::Tensor correct;  // [rows] fp32, 1 where the row's argmax is its label
};

// logits [rows, width] fp32/fp16/bf16 with unit stride along the row, of which the first `classes` columns
// are classes (the rest a padded vocabulary's); labels [rows] int64.
CrossEntropyRows cross_entropy_forward(const torch::Tensor& logits, const torch::Tensor& labels, int64_t classes);
// The gradient of sum(loss * scale) for a 0-dim fp32 scale on the device: [rows, width], zero in the padding.
torch::Tensor cross_entropy_backward(const torch::Tensor& logits, const torch::Tensor& labels, const torch::Tensor& lse,
                                     const torch::Tensor& scale, int64_t classes);

// Training-mode batch norm + ReLU (+ residual) on channels-last activations [N, C, H, W] (C a multiple of 8,
// or of 4 in fp32): y, and the batch's mean and 1/std per channel (fp32) for the backward. Updates the running
// statistics in place. relu false: batch norm alone (a shortcut's), through the same passes.
// passes: the kernels' choice between one cooperative launch and three (kernels/cuda/launch.h); kAuto except
// where a test compares the two.
enum class BatchNormPasses { kAuto, kSplit, kSinglePass };
struct BatchNormReluForward {
  torch::Tensor y, mean, invstd;
  torch::Tensor scale_shift;  // [2 * C]: y = relu(x * scale + shift [+ residual]); the backward's ReLU mask
  bool single_pass = false;   // which kernels ran
};
BatchNormReluForward batch_norm_relu_forward(const torch::Tensor& x, const torch::Tensor& residual,
                                             const torch::Tensor& weight, const torch::Tensor& bias,
                                             const torch::Tensor& running_mean, const torch::Tensor& running_var,
                                             double momentum, double eps, bool relu,
                                             BatchNormPasses passes = BatchNormPasses::kAuto);
// The same statistics from a convolution's per-channel sum and sum of squares of x (conv_stats) over count
// values a channel, without a pass over x: mean, invstd and scale_shift as above (y undefined), the running
// statistics updated. prologue_dtype fp16/bf16: scale and shift rounded to it, as a convolution's prologue
// applies them, and also returned in it as scale_shift_io [2 * C] (the prologue's operands); kFloat: neither.
struct BatchNormStatsFromSums {
  torch::Tensor mean, invstd, scale_shift, scale_shift_io;
};
BatchNormStatsFromSums batch_norm_stats_from_sums(const torch::Tensor& sum, const torch::Tensor& sum_of_squares,
                                                  int64_t count, const torch::Tensor& weight, const torch::Tensor& bias,
                                                  const torch::Tensor& running_mean, const torch::Tensor& running_var,
                                                  double momentum, double eps, c10::ScalarType prologue_dtype);
// y = relu(x * scale + shift [+ residual]) (relu false: no ReLU) from statistics already taken: the second
// pass of batch_norm_relu_forward alone. Also what the backward of batch norm + ReLU + convolution recomputes
// instead of keeping y.
torch::Tensor batch_norm_relu_apply(const torch::Tensor& x, const torch::Tensor& residual,
                                    const torch::Tensor& scale_shift, bool relu);
struct BatchNormReluBackward {
  torch::Tensor dx, dresidual, dweight, dbias;  // dresidual undefined without a residual
  bool single_pass = false;
};
// y is read (for the ReLU's mask) only with a residual and the ReLU; without, the mask comes from x and
// scale_shift (relu false: no mask). dy2 (may be undefined): the gradient of a second use of y, summed with dy
// as the passes read them (a ResNet block's output feeds the next block's convolution and its shortcut).
BatchNormReluBackward batch_norm_relu_backward(const torch::Tensor& dy, const torch::Tensor& dy2,
                                               const torch::Tensor& y, const torch::Tensor& x,
                                               const torch::Tensor& mean, const torch::Tensor& invstd,
                                               const torch::Tensor& scale_shift, const torch::Tensor& weight,
                                               bool with_residual, bool relu,
                                               BatchNormPasses passes = BatchNormPasses::kAuto);

// relu(bn(x) + bn2(x2)) in training mode (kernels::batch_norm_add_batch_norm_relu): both batch norms' statistics
// and y in one cooperative launch, or, where that cannot run, batch_norm_relu_forward for the shortcut's batch norm
// (no ReLU) and then for x with its output as the residual. The running statistics updated.
struct BatchNormStats {
  torch::Tensor mean, invstd, scale_shift;
};
struct DualBatchNormReluForward {
  torch::Tensor y;
  BatchNormStats stats, stats2;
  bool single_pass = false;
};
DualBatchNormReluForward batch_norm_add_batch_norm_relu_forward(const torch::Tensor& x, const BatchNormParams& bn,
                                                                const torch::Tensor& x2, const BatchNormParams& bn2);
// Its backward from dy (dy2: a twin's gradient, or undefined), the mask y > 0: one cooperative launch, or the two
// batch norms' backwards one after the other.
struct DualBatchNormReluBackward {
  torch::Tensor dx, dweight, dbias, dx2, dweight2, dbias2;
  bool single_pass = false;
};
DualBatchNormReluBackward batch_norm_add_batch_norm_relu_backward(const torch::Tensor& dy, const torch::Tensor& dy2,
                                                                  const torch::Tensor& y, const torch::Tensor& x,
                                                                  const torch::Tensor& x2, const BatchNormStats& stats,
                                                                  const BatchNormStats& stats2,
                                                                  const torch::Tensor& weight,
                                                                  const torch::Tensor& weight2);

// max_pool(relu(bn(x))) in training mode (kernels::batch_norm_relu_max_pool, ResNet's stem): the statistics and the
// pooled output in one cooperative launch, or, where that cannot run, batch_norm_relu_forward then
// max_pool_forward. The running statistics updated; positions as max_pool_forward's.
struct BatchNormReluMaxPoolForward {
  torch::Tensor y, positions;
  BatchNormStats stats;
  bool single_pass = false;
};
BatchNormReluMaxPoolForward batch_norm_relu_max_pool_forward(const torch::Tensor& x, const BatchNormParams& bn,
                                                             int64_t kernel, int64_t stride, int64_t padding);
// Its backward from the pooled gradient: one cooperative launch for a 3x3 stride-2 padding-1 pooling, else (or
// where it cannot run) max_pool_backward then batch_norm_relu_backward.
struct BatchNormReluMaxPoolBackward {
  torch::Tensor dx, dweight, dbias;
  bool single_pass = false;
};
BatchNormReluMaxPoolBackward batch_norm_relu_max_pool_backward(const torch::Tensor& dy, const torch::Tensor& positions,
                                                               const torch::Tensor& x, const BatchNormStats& stats,
                                                               const torch::Tensor& weight, int64_t kernel,
                                                               int64_t stride, int64_t padding);

// y = conv2d(x', weight) with x' = relu(x * scale + shift) when scale is defined (else x' = x), and y's sum
// and sum of squares per output channel (fp32), in one cuDNN fused graph (cudnn/conv_stats_graph.h). x and weight
// channels-last fp16/bf16 of one dtype, C a multiple of 8; scale and shift [C], any float dtype.
struct ConvStats {
  torch::Tensor y, sum, sum_of_squares;
};
// Whether cuDNN has an engine for this graph on x's device (built and kept on first use, so call it outside
// a CUDA graph capture); why not, in cuDNN's words, when it has none. precompiled_only: an engine that compiles
// its kernel at run time does not count, nor any while deterministic cuDNN is asked for (the statistics' sums
// vary from run to run).
bool conv_stats_supported(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride, int64_t padding,
                          bool prologue, std::string* why_not = nullptr, bool precompiled_only = false);
ConvStats conv_stats(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride, int64_t padding,
                     const torch::Tensor& scale, const torch::Tensor& shift);

// Square max pooling of channels-last [N, C, H, W] x (C a multiple of 8, or of 4 in fp32; no dilation, floor
// mode): y (channels-last) and, for the backward, the position of each output's maximum within its window
// (uint8 [N, OH, OW, C]).
struct MaxPoolForward {
  torch::Tensor y, positions;
};
MaxPoolForward max_pool_forward(const torch::Tensor& x, int64_t kernel, int64_t stride, int64_t padding);
// dx shaped as x_sizes (channels-last) from dy and the forward's positions.
torch::Tensor max_pool_backward(const torch::Tensor& dy, const torch::Tensor& positions, at::IntArrayRef x_sizes,
                                int64_t kernel, int64_t stride, int64_t padding);

// x [N, C, H, W] (any strides, fp32/fp16/bf16) regrouped for the stem's space-to-depth convolution
// (stem_conv.h): channels-last [N, out_channels, out_h, out_w] in dtype, where stem_conv.cpp says what out_h
// and out_w are (the 7x7 stride-2 padding-3 convolution's output size + 3).
torch::Tensor space_to_depth(const torch::Tensor& x, int64_t out_channels, int64_t out_h, int64_t out_w,
                             c10::ScalarType dtype);

// dst[i] = src[i] cast to dst[i]'s dtype, element for element in memory order, for pairs of one shape and
// strides, each non-overlapping and dense; all sources of one dtype, all destinations of one (fp32/fp16/bf16),
// all on one CUDA device. One launch for every 32 pairs (kernels/parameter_cast.h).
void cast_tensors(const std::vector<torch::Tensor>& src, const std::vector<torch::Tensor>& dst);

// LayerNorm over the last dimension of fp32 x [..., C] (C a multiple of 8), after adding branch when it is
// defined: sum = x + branch (fp32), out = layer_norm(sum) in out_dtype; mean and rstd per row for the backward;
// with_amax: out_amax, out's amax for its FP8 cast (Fp8CastExtras::amax_stats), from the pass that writes out.
struct AddLayerNormForward {
  torch::Tensor sum, out, mean, rstd;  // sum undefined without a branch
  torch::Tensor out_amax;              // undefined unless with_amax
};
AddLayerNormForward add_layer_norm_forward(const torch::Tensor& x, const torch::Tensor& branch,
                                           const torch::Tensor& weight, const torch::Tensor& bias, double eps,
                                           c10::ScalarType out_dtype, bool with_amax = false);
struct AddLayerNormBackward {
  torch::Tensor grad_x, grad_branch, grad_weight, grad_bias;  // grad_branch undefined without a branch
};
// input is sum (x without a branch); grad_sum (may be undefined) the gradient sum received from elsewhere.
AddLayerNormBackward add_layer_norm_backward(const torch::Tensor& grad_out, const torch::Tensor& grad_sum,
                                             const torch::Tensor& input, const torch::Tensor& mean,
                                             const torch::Tensor& rstd, const torch::Tensor& weight,
                                             c10::ScalarType branch_dtype, bool with_branch);

// A linear layer's bias gradient from its output's gradient grad [rows, cols] (fp32/fp16/bf16, cols a multiple
// of 8): grad's column sums, added in fp32 in an order fixed by the shape, in bias_dtype (cuda/launch.h:
// bias_gradient).
torch::Tensor bias_gradient(const torch::Tensor& grad, c10::ScalarType bias_dtype);
// The same through GELU (tanh approximation): grad_input = grad * gelu'(gelu_input) (both [rows, cols], one
// dtype), in their dtype, and the bias gradient, grad_input's column sums as written, in bias_dtype.
struct GeluBiasGradient {
  torch::Tensor grad_input, grad_bias;
};
GeluBiasGradient gelu_backward_bias_gradient(const torch::Tensor& grad, const torch::Tensor& gelu_input,
                                             c10::ScalarType bias_dtype);
// GELU (tanh approximation) of x (fp32/fp16/bf16 on CUDA, made contiguous) in x's dtype, in LibTorch's fp32 steps;
// with_amax: amax, y's amax for its FP8 cast (Fp8CastExtras::amax_stats), from the pass that writes y.
struct GeluForward {
  torch::Tensor y, amax;  // amax undefined unless with_amax
};
GeluForward gelu_tanh_forward(const torch::Tensor& x, bool with_amax);
// Its backward: grad_x = grad * gelu'(x) (grad and x one shape and dtype), in LibTorch's fp32 steps; with_amax:
// amax, grad_x's amax for its FP8 cast.
struct GeluBackward {
  torch::Tensor grad_x, amax;  // amax undefined unless with_amax
};
GeluBackward gelu_tanh_backward(const torch::Tensor& grad, const torch::Tensor& x, bool with_amax);

// The tensorwise FP8 cast of x (fp32/fp16/bf16 on CUDA, any shape; made contiguous): data, shaped as x, in
// E5M2 (e5m2) or E4M3, and the amax, scale and inv_scale of x as one-element fp32 tensors on the device, each
// 16-byte aligned as cuBLASLt needs its scales (cuda/launch.h: fp8_scaled_cast). What the FP8 linear's
// products need besides, written in the same pass over x viewed as [rows, cols] (cols its last dimension; both
// multiples of 16): transposed, the bytes of data.t().contiguous(); column_sums, x's column sums in fp32 (the
// bias gradient); delayed, the scale from an amax history instead of x's amax, the amax of x recorded in it.
// cuda/launch.h: fp8_scaled_cast_transposed.
// Delayed scaling's state of one tensor role (cuda/launch.h: Fp8DelayedScaling): state [history_len + 1] fp32 on
// the tensor's device, zeros until the first cast, which sets primed.
struct Fp8AmaxHistory {
  torch::Tensor state;
  bool primed = false;
};
// An amax computed by the kernel that wrote x, for x's cast to take instead of a pass of its own: fp32
// [3 * cuda::kFp8StatsStride] zeros on x's device (fp8_amax_stats), whose first element that kernel raises to
// x's amax; the cast then writes its scale and inverse scale into it.
torch::Tensor fp8_amax_stats(const torch::Device& device);
struct Fp8CastExtras {
  bool transposed = false;
  bool column_sums = false;            // needs transposed
  Fp8AmaxHistory* delayed = nullptr;   // needs transposed; null: dynamic scaling (x's own amax)
  torch::Tensor amax_stats = {};       // dynamic scaling only; undefined: the cast computes x's amax itself
};
struct Fp8Cast {
  torch::Tensor data, amax, scale, inv_scale, transposed, column_sums;
};
Fp8Cast fp8_cast(const torch::Tensor& x, bool e5m2, Fp8CastExtras extras = {});

}  // namespace ptrain::kernels::fused
