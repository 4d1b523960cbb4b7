#include "ptrain/kernels/linear.h"

#include <torch/csrc/autograd/custom_function.h>

#include "ptrain/core/torch_compat.h"
#include "ptrain/kernels/fused.h"

namespace ptrain::kernels {

namespace {

torch::Tensor gelu_tanh(const torch::Tensor& h) { return torch::gelu(h, "tanh"); }

// The forward is LibTorch's. The backward takes the products as LibTorch's addmm backward does (grad . W, and
// grad^T . x in the weight's own layout), and the bias gradient from the fused column sums.
class FusedLinear : public torch::autograd::Function<FusedLinear> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& weight, const torch::Tensor& bias, bool gelu) {
    auto h = torch::linear(x, weight, bias);
    ctx->save_for_backward({x, weight, gelu ? h : torch::Tensor()});
    ctx->saved_data["gelu"] = gelu;
    ctx->saved_data["bias_dtype"] = static_cast<int64_t>(bias.scalar_type());
    return {gelu ? gelu_tanh(h) : h};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& weight = saved[1];
    const auto bias_dtype = static_cast<c10::ScalarType>(ctx->saved_data["bias_dtype"].toInt());
    const int64_t out = weight.size(0), in = weight.size(1);
    const auto grad = grads[0].reshape({-1, out}).contiguous();
    torch::Tensor grad_h, grad_bias;
    if (ctx->saved_data["gelu"].toBool()) {
      auto g = fused::gelu_backward_bias_gradient(grad, saved[2].reshape({-1, out}), bias_dtype);
      grad_h = std::move(g.grad_input);
      grad_bias = std::move(g.grad_bias);
    } else {
      grad_h = grad;
      grad_bias = fused::bias_gradient(grad, bias_dtype);
    }
    torch::Tensor grad_x, grad_weight;
    if (ctx->needs_input_grad(0)) grad_x = grad_h.mm(weight).view(x.sizes());
    if (ctx->needs_input_grad(1)) grad_weight = grad_h.t().mm(x.reshape({-1, in}));
    return {grad_x, grad_weight, grad_bias, torch::Tensor()};
  }
};

}  // namespace

bool fused_linear_applies(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (!x.defined() || !weight.defined() || !bias.defined() || !fused::available(x.device())) return false;
  const auto dtype = x.scalar_type();
  if (!fused::kernel_dtype(dtype) || weight.scalar_type() != dtype || bias.scalar_type() != dtype) return false;
  if (weight.device() != x.device() || bias.device() != x.device()) return false;
  if (x.dim() < 1 || x.numel() == 0 || weight.dim() != 2 || x.size(-1) != weight.size(1)) return false;
  if (bias.dim() != 1 || bias.size(0) != weight.size(0) || weight.size(0) % 8 != 0) return false;
  const auto device = x.device().type();
  return !compat::autocast_enabled(device) || compat::autocast_dtype(device) == dtype;
}

torch::Tensor reference_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                               LinearActivation activation) {
  auto h = torch::linear(x, weight, bias);
  return activation == LinearActivation::kGeluTanh ? gelu_tanh(h) : h;
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                     LinearActivation activation, bool allow_fused) {
  if (!allow_fused || !fused_linear_applies(x, weight, bias)) return reference_linear(x, weight, bias, activation);
  return FusedLinear::apply(x, weight, bias, activation == LinearActivation::kGeluTanh)[0];
}

}  // namespace ptrain::kernels
