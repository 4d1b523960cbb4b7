// A pooling's kernel, stride and padding, kept in an autograd context from the forward of the functions that pool
// (max_pool.cpp's FusedMaxPool2d, batch_norm_relu.cpp's FusedBatchNormReluMaxPool) to their backward. Included by
// those two files only: it brings LibTorch's custom-function header, which the public headers keep out.
#pragma once

#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>

namespace ptrain::kernels {

struct SavedPooling {
  int64_t kernel, stride, padding;
};

inline void save_pooling(torch::autograd::AutogradContext* ctx, int64_t kernel, int64_t stride, int64_t padding) {
  ctx->saved_data["kernel"] = kernel;
  ctx->saved_data["stride"] = stride;
  ctx->saved_data["padding"] = padding;
}

inline SavedPooling saved_pooling(torch::autograd::AutogradContext* ctx) {
  return {ctx->saved_data["kernel"].toInt(), ctx->saved_data["stride"].toInt(), ctx->saved_data["padding"].toInt()};
}

}  // namespace ptrain::kernels
