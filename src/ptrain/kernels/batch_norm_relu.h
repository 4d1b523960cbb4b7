// relu(batch_norm(x) [+ residual]) in training mode, updating the running statistics: every ResNet block's
// "bn, relu" and "bn, add the shortcut, relu". On CUDA, for channels-last activations, the fused kernels of
// cuda/batch_norm.cu make three passes over the activations each way instead of LibTorch's five forward and
// eight backward; elsewhere LibTorch's batch_norm, add and relu run as before. tests/kernels compares the two.
//
// Which of the two runs is decided once, by the caller: it asks the fused_*_applies function of the entry
// (with its own conditions on top: a model's fused-kernels switch, its fusions) and passes the answer as a
// KernelPath, which the entry obeys without asking again. An entry told kFused for tensors the kernels
// cannot take fails in the kernels rather than quietly running the reference.
#pragma once

#include <torch/torch.h>

#include "ptrain/kernels/batch_norm_params.h"
#include "ptrain/kernels/conv_stats.h"

namespace ptrain::kernels {

enum class KernelPath { kReference, kFused };
inline KernelPath fused_if(bool fused) { return fused ? KernelPath::kFused : KernelPath::kReference; }

// weight/bias may be undefined (no affine), residual undefined (no add). running_mean/var are updated with
// momentum (the variance unbiased), as torch.nn.BatchNorm2d in training mode does.
// twin (may be null): for an output used twice (a ResNet block's, by the next block's convolution and its
// shortcut). Where the fused kernels run with a residual, *twin is a second tensor on the output's memory whose
// gradient autograd hands the backward apart from the output's, and the backward kernels sum the two as they
// read them: one pass over the activations fewer than autograd's own add, and no kernel of its own. Elsewhere
// *twin is undefined and the caller uses the output twice.
// kFused where fused_batch_norm_relu_applies(x, residual, weight, running_mean).
torch::Tensor batch_norm_relu(KernelPath path, const torch::Tensor& x, const torch::Tensor& residual,
                              const torch::Tensor& weight, const torch::Tensor& bias, const torch::Tensor& running_mean,
                              const torch::Tensor& running_var, double momentum, double eps,
                              torch::Tensor* twin = nullptr);

// relu(batch_norm(x) + batch_norm(x2)): a ResNet block whose shortcut has a convolution and batch norm of its own
// (the first block of a stage), both batch norms in training mode, both running statistics updated. kFused (where
// fused_batch_norm_add_batch_norm_relu_applies): one fused function: the shortcut's output is never written, nor its
// gradient, and both batch norms run in one pass each way. twin: as batch_norm_relu's. kReference: LibTorch's batch
// norms, add and ReLU.
torch::Tensor batch_norm_add_batch_norm_relu(KernelPath path, const torch::Tensor& x, const BatchNormParams& bn,
                                             const torch::Tensor& x2, const BatchNormParams& bn2,
                                             torch::Tensor* twin = nullptr);
// Whether the fused kernels take both batch norms (fused_batch_norm_relu_applies for each, x2 shaped and typed as x,
// the parameters of one dtype).
bool fused_batch_norm_add_batch_norm_relu_applies(const torch::Tensor& x, const BatchNormParams& bn,
                                                  const torch::Tensor& x2, const BatchNormParams& bn2);

// max_pool2d(relu(batch_norm(x)), kernel, stride, padding): ResNet's ImageNet stem, the batch norm in training
// mode. kFused (where fused_batch_norm_relu_max_pool_applies: fused_batch_norm_relu_applies and
// kernels::fused_max_pool2d_applies, the parameters and statistics of one dtype): one fused function: the batch
// norm's output is never written, nor the pooling's input gradient, and each way is one pass (the backward's for a
// 3x3 stride-2 pooling); the same values as the two functions. kReference: LibTorch's batch norm, ReLU and pooling.
torch::Tensor batch_norm_relu_max_pool(KernelPath path, const torch::Tensor& x, const BatchNormParams& bn,
                                       int64_t kernel, int64_t stride, int64_t padding);
bool fused_batch_norm_relu_max_pool_applies(const torch::Tensor& x, const BatchNormParams& bn, int64_t kernel,
                                            int64_t stride, int64_t padding);

// batch_norm(x) in training mode with no ReLU after it (a ResNet shortcut's): kFused (where
// fused_batch_norm_relu_applies(x, {}, ...)), batch_norm_relu's kernels; kReference, LibTorch's batch_norm.
torch::Tensor batch_norm_training(KernelPath path, const torch::Tensor& x, const torch::Tensor& weight,
                                  const torch::Tensor& bias, const torch::Tensor& running_mean,
                                  const torch::Tensor& running_var, double momentum, double eps);

torch::Tensor reference_batch_norm_relu(const torch::Tensor& x, const torch::Tensor& residual,
                                        const torch::Tensor& weight, const torch::Tensor& bias,
                                        const torch::Tensor& running_mean, const torch::Tensor& running_var,
                                        double momentum, double eps);

// A convolution's geometry (no bias, zero padding): what batch_norm_relu_conv applies after the ReLU.
struct ConvGeometry {
  std::vector<int64_t> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
};

// conv2d(relu(batch_norm(x)), conv_weight) in training mode, the ResNet block's "bn, relu, next conv", with
// the ReLU's output not kept for the backward: the convolution's weight gradient needs it, and the backward
// recomputes it from x (kept for the batch norm's own backward anyway) in one elementwise pass. That saves
// one activation tensor per pair (about a third of a ResNet-50's) for a pass over it, with the same
// gradients bit for bit. kFused where fused_batch_norm_relu_applies(x, {}, ...), conv_weight already in x's dtype
// (the caller casts it as autocast would). kReference: the reference ops.
torch::Tensor batch_norm_relu_conv(KernelPath path, const torch::Tensor& x, const torch::Tensor& weight,
                                   const torch::Tensor& bias, const torch::Tensor& running_mean,
                                   const torch::Tensor& running_var, double momentum, double eps,
                                   const torch::Tensor& conv_weight, const ConvGeometry& conv);

// The same functions for the output of a convolution that also returned its statistics (in, from
// conv_with_stats or batch_norm_relu_conv_with_stats): the batch norm takes mean and variance from in's sums
// (E[y^2] - E[y]^2, as cuDNN's own batch-norm finalize does) instead of reading in.y for them, and its backward
// is batch_norm_relu's, which differentiates through the statistics. That is MLPerf ResNet-50's fusion of the
// batch norms into the convolutions (docs/results/2026-12-04-h200-cudnn-fusion-probe.md). kFused where
// fused_batch_norm_relu_applies(in.y, residual, ...); kReference: the reference ops on in.y, whose own statistics
// are in's sums up to rounding.
torch::Tensor batch_norm_relu(KernelPath path, const ConvStatsResult& in, const torch::Tensor& residual,
                              const torch::Tensor& weight, const torch::Tensor& bias, const torch::Tensor& running_mean,
                              const torch::Tensor& running_var, double momentum, double eps,
                              torch::Tensor* twin = nullptr);
torch::Tensor batch_norm_training(KernelPath path, const ConvStatsResult& in, const torch::Tensor& weight,
                                  const torch::Tensor& bias, const torch::Tensor& running_mean,
                                  const torch::Tensor& running_var, double momentum, double eps);
// conv2d(relu(batch_norm(in.y)), conv_weight, stride, padding) with the convolution's statistics: the batch
// norm + ReLU applied in the convolution's prologue (conv_stats), so its output is never written, and
// recomputed in the backward as batch_norm_relu_conv does. path: the batch norm's, as batch_norm_relu(path, in, ...)
// takes it. conv_weight in in.y's dtype. Where the path is kReference, or cuDNN has no fused graph for it (which
// only this function asks): batch_norm_relu(path, in, ...) then conv_with_stats.
ConvStatsResult batch_norm_relu_conv_with_stats(KernelPath path, const ConvStatsResult& in, const torch::Tensor& weight,
                                                const torch::Tensor& bias, const torch::Tensor& running_mean,
                                                const torch::Tensor& running_var, double momentum, double eps,
                                                const torch::Tensor& conv_weight, int64_t stride, int64_t padding);

// Whether the fused kernels take these tensors (the KernelPath of the functions above): CUDA,
// channels-last, fp32/fp16/bf16 activations with channels a multiple of 16 bytes' worth, affine parameters and
// running statistics in fp32 or the activations' dtype, a residual like x.
bool fused_batch_norm_relu_applies(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight,
                                   const torch::Tensor& running_mean);

}  // namespace ptrain::kernels
