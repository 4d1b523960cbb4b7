// The global average pooling of a classifier head: [N, C, H, W] -> [N, C], the mean over H and W. LibTorch's
// adaptive_avg_pool2d to 1x1 takes the mean and, for a channels-last input, restrides its output in place; the
// backward of that restriding and of the mean then wrote the gradient twice, the second time transposed into
// channels-last for the layer before (88 us of an H200's ResNet-50 amp-bf16 step at batch 128, 25.7 MB of bf16
// gradient). Here the backward writes it once, in x's memory format, from the broadcast [N, C] gradient.
#pragma once

#include <torch/torch.h>

namespace ptrain::kernels {

// x: 4-D, any dtype and memory format. In training and evaluation alike; the same values as
// adaptive_avg_pool2d(x, {1, 1}).flatten(1).
torch::Tensor global_average_pool(const torch::Tensor& x);

}  // namespace ptrain::kernels
