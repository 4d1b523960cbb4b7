#include "ptrain/kernels/average_pool.h"

#include <torch/csrc/autograd/custom_function.h>

#include "ptrain/core/error.h"

namespace ptrain::kernels {

namespace {

class GlobalAveragePool : public torch::autograd::Function<GlobalAveragePool> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x) {
    ctx->saved_data["sizes"] = x.sizes().vec();
    ctx->saved_data["channels_last"] = x.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
    return {x.mean({2, 3})};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    const auto format = ctx->saved_data["channels_last"].toBool() ? at::MemoryFormat::ChannelsLast
                                                                  : at::MemoryFormat::Contiguous;
    const auto& grad = grad_outputs[0];
    // The division on the [N, C] gradient, then one copy of its broadcast into x's layout.
    auto dx = torch::empty(sizes, grad.options().memory_format(format));
    dx.copy_((grad / static_cast<double>(sizes[2] * sizes[3])).view({sizes[0], sizes[1], 1, 1}).expand(sizes));
    return {dx};
  }
};

}  // namespace

torch::Tensor global_average_pool(const torch::Tensor& x) {
  check(x.dim() == 4, "global_average_pool: expected a 4-D input (N, C, H, W), got " + std::to_string(x.dim()) + "-D");
  return GlobalAveragePool::apply(x)[0];
}

}  // namespace ptrain::kernels
