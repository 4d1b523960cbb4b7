#include "ptrain/kernels/batch_norm_relu.h"

#include <torch/csrc/autograd/custom_function.h>

#include "ptrain/kernels/fused.h"

namespace ptrain::kernels {

namespace {

bool is_floating(torch::ScalarType t) { return t == torch::kFloat || t == torch::kHalf || t == torch::kBFloat16; }

// Saves x and y (y is the next layer's input, kept anyway; its sign is the ReLU's mask) and the batch's
// statistics: nothing beyond what the unfused layers keep.
class FusedBatchNormRelu : public torch::autograd::Function<FusedBatchNormRelu> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& residual, const torch::Tensor& weight,
                                                const torch::Tensor& bias, const torch::Tensor& running_mean,
                                                const torch::Tensor& running_var, double momentum, double eps) {
    auto out = fused::batch_norm_relu_forward(x, residual, weight, bias, running_mean, running_var, momentum, eps);
    ctx->save_for_backward({x, out.y, out.mean, out.invstd, weight});
    ctx->saved_data["residual"] = residual.defined();
    ctx->saved_data["affine"] = weight.defined();
    return {out.y};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const bool residual = ctx->saved_data["residual"].toBool();
    const bool affine = ctx->saved_data["affine"].toBool();
    auto grads = fused::batch_norm_relu_backward(grad_outputs[0], saved[1], saved[0], saved[2], saved[3],
                                                 affine ? saved[4] : torch::Tensor(), residual);
    return {grads.dx,    grads.dresidual,    grads.dweight,    grads.dbias,
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool fused_batch_norm_relu_applies(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight,
                                   const torch::Tensor& running_mean) {
  if (!fused::available(x.device()) || x.dim() != 4 || !is_floating(x.scalar_type())) return false;
  if (!x.is_contiguous(at::MemoryFormat::ChannelsLast) || x.numel() == 0) return false;
  const int64_t vector = x.scalar_type() == torch::kFloat ? 4 : 8;
  if (x.size(1) % vector != 0) return false;
  if (residual.defined() && (residual.sizes() != x.sizes() || residual.scalar_type() != x.scalar_type() ||
                             !residual.is_contiguous(at::MemoryFormat::ChannelsLast)))
    return false;
  for (const auto* p : {&weight, &running_mean}) {
    if (p->defined() && p->scalar_type() != torch::kFloat && p->scalar_type() != x.scalar_type()) return false;
  }
  if (weight.defined() && running_mean.defined() && weight.scalar_type() != running_mean.scalar_type()) return false;
  return true;
}

torch::Tensor reference_batch_norm_relu(const torch::Tensor& x, const torch::Tensor& residual,
                                        const torch::Tensor& weight, const torch::Tensor& bias,
                                        const torch::Tensor& running_mean, const torch::Tensor& running_var,
                                        double momentum, double eps) {
  auto y = torch::batch_norm(x, weight, bias, running_mean, running_var, /*training=*/true, momentum, eps,
                             at::globalContext().userEnabledCuDNN());
  return torch::relu(residual.defined() ? y + residual : y);
}

torch::Tensor batch_norm_relu(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight,
                              const torch::Tensor& bias, const torch::Tensor& running_mean,
                              const torch::Tensor& running_var, double momentum, double eps, bool allow_fused) {
  if (!allow_fused || !fused_batch_norm_relu_applies(x, residual, weight, running_mean))
    return reference_batch_norm_relu(x, residual, weight, bias, running_mean, running_var, momentum, eps);
  return FusedBatchNormRelu::apply(x, residual, weight, bias, running_mean, running_var, momentum, eps)[0];
}

}  // namespace ptrain::kernels
