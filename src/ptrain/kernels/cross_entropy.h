// Cross-entropy of logits against class labels, with the count of rows whose argmax is the label (the
// trainer's accuracy), in one call. On CUDA the fused kernels (cuda/cross_entropy.cu) read the logits in
// their own dtype and never hold them in fp32; elsewhere, or with allow_fused false, LibTorch's ops do what
// the trainer always did: cast to fp32, cross_entropy, argmax. tests/kernels compares the two.
#pragma once

#include <torch/torch.h>

namespace ptrain::kernels {

enum class Reduction { kMean, kSum };

struct LossAndCorrect {
  torch::Tensor loss;     // fp32 scalar, differentiable in the logits
  torch::Tensor correct;  // fp32 scalar count, not differentiable
};

// logits [rows, width] in fp32, fp16 or bf16, of which the first `classes` columns are the classes (0: all;
// fewer when a model pads its vocabulary to a multiple the matrix kernels like); labels [rows] int64 in
// [0, classes). The padding's gradient is zero.
LossAndCorrect cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels, Reduction reduction,
                             bool allow_fused, int64_t classes = 0);

// The unfused reference: LibTorch's cross_entropy on the fp32 classes' columns, and argmax.
LossAndCorrect reference_cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels, Reduction reduction,
                                       int64_t classes = 0);

// Whether cross_entropy(..., allow_fused = true) takes the fused path for these logits.
bool fused_cross_entropy_applies(const torch::Tensor& logits);
// Whether this build has fused kernels for tensors on device (CUDA builds, CUDA devices).
bool fused_kernels_available(const torch::Device& device);

}  // namespace ptrain::kernels
