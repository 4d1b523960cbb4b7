#include "ptrain/kernels/layer_norm.h"

#include <torch/csrc/autograd/custom_function.h>

#include "ptrain/kernels/fused.h"

namespace ptrain::kernels {

namespace {

// out, then out's amax where asked for: a further output, without a gradient.
torch::autograd::variable_list outputs_with_amax(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list outputs, const torch::Tensor& amax) {
  if (!amax.defined()) return outputs;
  ctx->mark_non_differentiable({amax});
  outputs.push_back(amax);
  return outputs;
}

// Two functions, with and without the branch: LibTorch 2.x's custom functions take no undefined input.
class FusedLayerNorm : public torch::autograd::Function<FusedLayerNorm> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& weight, const torch::Tensor& bias, double eps,
                                                int64_t out_dtype, bool with_amax) {
    auto f = fused::add_layer_norm_forward(x, torch::Tensor(), weight, bias, eps,
                                           static_cast<c10::ScalarType>(out_dtype), with_amax);
    ctx->save_for_backward({x, f.mean, f.rstd, weight});
    return outputs_with_amax(ctx, {f.out}, f.out_amax);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    auto g = fused::add_layer_norm_backward(grads[0], torch::Tensor(), s[0], s[1], s[2], s[3], torch::kFloat, false);
    return {g.grad_x, g.grad_weight, g.grad_bias, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Returns sum and out: the gradient reaching sum from its later use (the block's next residual add) joins
// the LayerNorm's in one pass.
class FusedAddLayerNorm : public torch::autograd::Function<FusedAddLayerNorm> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& branch, const torch::Tensor& weight,
                                                const torch::Tensor& bias, double eps, int64_t out_dtype,
                                                bool with_amax) {
    auto f = fused::add_layer_norm_forward(x, branch, weight, bias, eps, static_cast<c10::ScalarType>(out_dtype),
                                           with_amax);
    ctx->save_for_backward({f.sum, f.mean, f.rstd, weight});
    ctx->saved_data["branch_dtype"] = static_cast<int64_t>(branch.scalar_type());
    return outputs_with_amax(ctx, {f.sum, f.out}, f.out_amax);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const auto branch_dtype = static_cast<c10::ScalarType>(ctx->saved_data["branch_dtype"].toInt());
    torch::Tensor grad_out = grads[1];
    if (!grad_out.defined()) grad_out = torch::zeros(s[0].sizes(), s[0].options());
    auto g = fused::add_layer_norm_backward(grad_out, grads[0], s[0], s[1], s[2], s[3], branch_dtype, true);
    return {g.grad_x, g.grad_branch, g.grad_weight, g.grad_bias, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool fused_add_layer_norm_applies(const torch::Tensor& x, const torch::Tensor& branch, const torch::Tensor& weight,
                                  c10::ScalarType out_dtype) {
  if (!fused::available(x.device()) || x.scalar_type() != torch::kFloat || !x.is_contiguous() || x.dim() < 1) return false;
  if (x.numel() == 0 || x.size(-1) % 8 != 0 || !fused::kernel_dtype(out_dtype)) return false;
  if (!weight.defined() || weight.scalar_type() != torch::kFloat || weight.numel() != x.size(-1)) return false;
  return !branch.defined() ||
         (branch.sizes() == x.sizes() && branch.is_contiguous() && fused::kernel_dtype(branch.scalar_type()) &&
          branch.device() == x.device());
}

AddLayerNorm reference_add_layer_norm(const torch::Tensor& x, const torch::Tensor& branch, const torch::Tensor& weight,
                                      const torch::Tensor& bias, double eps, c10::ScalarType out_dtype) {
  AddLayerNorm out;
  out.sum = branch.defined() ? x + branch : x;
  out.out = torch::layer_norm(out.sum, {out.sum.size(-1)}, weight, bias, eps).to(out_dtype);
  return out;
}

AddLayerNorm add_layer_norm(const torch::Tensor& x, const torch::Tensor& branch, const torch::Tensor& weight,
                            const torch::Tensor& bias, double eps, c10::ScalarType out_dtype, bool allow_fused,
                            bool with_amax) {
  if (!allow_fused || !fused_add_layer_norm_applies(x, branch, weight, out_dtype))
    return reference_add_layer_norm(x, branch, weight, bias, eps, out_dtype);
  const auto dtype = static_cast<int64_t>(out_dtype);
  const auto amax_of = [&](const torch::autograd::variable_list& out, size_t at) {
    return with_amax ? out[at] : torch::Tensor();
  };
  if (!branch.defined()) {
    auto out = FusedLayerNorm::apply(x, weight, bias, eps, dtype, with_amax);
    return {x, out[0], amax_of(out, 1)};
  }
  auto out = FusedAddLayerNorm::apply(x, branch, weight, bias, eps, dtype, with_amax);
  return {out[0], out[1], amax_of(out, 2)};
}

}  // namespace ptrain::kernels
