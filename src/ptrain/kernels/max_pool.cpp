#include "ptrain/kernels/max_pool.h"

#include <torch/csrc/autograd/custom_function.h>

#include "ptrain/kernels/fused.h"
#include "ptrain/kernels/saved_pooling.h"

namespace ptrain::kernels {

namespace {

// Saves the window positions of the maxima (one byte an output), not the input.
class FusedMaxPool2d : public torch::autograd::Function<FusedMaxPool2d> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                int64_t kernel, int64_t stride, int64_t padding) {
    auto out = fused::max_pool_forward(x, kernel, stride, padding);
    ctx->save_for_backward({out.positions});
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    save_pooling(ctx, kernel, stride, padding);
    return {out.y};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto x_sizes = ctx->saved_data["x_sizes"].toIntVector();
    const SavedPooling pool = saved_pooling(ctx);
    auto dx = fused::max_pool_backward(grad_outputs[0], saved[0], x_sizes, pool.kernel, pool.stride, pool.padding);
    return {dx, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool fused_max_pool2d_applies(const torch::Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  if (!fused::nhwc_vectors(x)) return false;
  if (kernel <= 0 || kernel * kernel > 255 || stride <= 0 || padding < 0 || 2 * padding > kernel) return false;
  return x.size(2) + 2 * padding >= kernel && x.size(3) + 2 * padding >= kernel;
}

torch::Tensor max_pool2d(const torch::Tensor& x, int64_t kernel, int64_t stride, int64_t padding, bool allow_fused) {
  if (!allow_fused || !fused_max_pool2d_applies(x, kernel, stride, padding))
    return torch::max_pool2d(x, kernel, stride, padding);
  return FusedMaxPool2d::apply(x, kernel, stride, padding)[0];
}

}  // namespace ptrain::kernels
