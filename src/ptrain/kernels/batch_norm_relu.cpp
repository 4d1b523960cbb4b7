#include "ptrain/kernels/batch_norm_relu.h"

#include <torch/csrc/autograd/custom_function.h>

#include "ptrain/kernels/fused.h"

namespace ptrain::kernels {

namespace {

// Saves x and y (y is the next layer's input, kept anyway; its sign is the ReLU's mask) and the batch's
// statistics: nothing beyond what the unfused layers keep. Two functions, with and without the residual,
// since LibTorch 2.x's custom functions take no undefined tensor as an input.
torch::autograd::variable_list fused_forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                             const torch::Tensor& residual, const torch::Tensor& weight,
                                             const torch::Tensor& bias, const torch::Tensor& running_mean,
                                             const torch::Tensor& running_var, double momentum, double eps) {
  auto out = fused::batch_norm_relu_forward(x, residual, weight, bias, running_mean, running_var, momentum, eps,
                                            /*relu=*/true);
  // y only with a residual (the ReLU's mask); without, the mask is recomputed from x and scale_shift.
  ctx->save_for_backward({x, residual.defined() ? out.y : torch::Tensor(), out.mean, out.invstd, out.scale_shift, weight});
  return {out.y};
}

fused::BatchNormReluBackward fused_backward(torch::autograd::AutogradContext* ctx,
                                            const torch::autograd::variable_list& grad_outputs, bool residual) {
  const auto saved = ctx->get_saved_variables();
  return fused::batch_norm_relu_backward(grad_outputs[0], saved[1], saved[0], saved[2], saved[3], saved[4], saved[5],
                                         residual, /*relu=*/true);
}

class FusedBatchNormRelu : public torch::autograd::Function<FusedBatchNormRelu> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& weight, const torch::Tensor& bias,
                                                const torch::Tensor& running_mean, const torch::Tensor& running_var,
                                                double momentum, double eps) {
    return fused_forward(ctx, x, torch::Tensor(), weight, bias, running_mean, running_var, momentum, eps);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto g = fused_backward(ctx, grad_outputs, /*residual=*/false);
    return {g.dx, g.dweight, g.dbias, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

class FusedBatchNormAddRelu : public torch::autograd::Function<FusedBatchNormAddRelu> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& residual, const torch::Tensor& weight,
                                                const torch::Tensor& bias, const torch::Tensor& running_mean,
                                                const torch::Tensor& running_var, double momentum, double eps) {
    return fused_forward(ctx, x, residual, weight, bias, running_mean, running_var, momentum, eps);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto g = fused_backward(ctx, grad_outputs, /*residual=*/true);
    return {g.dx, g.dresidual, g.dweight, g.dbias, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// A shortcut's batch norm, no ReLU after it: the same kernels with the mask off; keeps x and the statistics.
class FusedBatchNorm : public torch::autograd::Function<FusedBatchNorm> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& weight, const torch::Tensor& bias,
                                                const torch::Tensor& running_mean, const torch::Tensor& running_var,
                                                double momentum, double eps) {
    auto out = fused::batch_norm_relu_forward(x, torch::Tensor(), weight, bias, running_mean, running_var, momentum,
                                              eps, /*relu=*/false);
    ctx->save_for_backward({x, out.mean, out.invstd, out.scale_shift, weight});
    return {out.y};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    auto g = fused::batch_norm_relu_backward(grad_outputs[0], torch::Tensor(), saved[0], saved[1], saved[2], saved[3],
                                             saved[4], /*with_residual=*/false, /*relu=*/false);
    return {g.dx, g.dweight, g.dbias, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Keeps x and the statistics, not y: the convolution's backward gets y recomputed.
class FusedBatchNormReluConv : public torch::autograd::Function<FusedBatchNormReluConv> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& weight, const torch::Tensor& bias,
                                                const torch::Tensor& running_mean, const torch::Tensor& running_var,
                                                const torch::Tensor& conv_weight, double momentum, double eps,
                                                const ConvGeometry& conv) {
    auto bn = fused::batch_norm_relu_forward(x, torch::Tensor(), weight, bias, running_mean, running_var, momentum, eps,
                                             /*relu=*/true);
    auto out = at::convolution(bn.y, conv_weight, /*bias=*/{}, conv.stride, conv.padding, conv.dilation,
                               /*transposed=*/false, /*output_padding=*/{0, 0}, conv.groups);
    ctx->save_for_backward({x, bn.mean, bn.invstd, bn.scale_shift, weight, conv_weight});
    ctx->saved_data["stride"] = conv.stride;
    ctx->saved_data["padding"] = conv.padding;
    ctx->saved_data["dilation"] = conv.dilation;
    ctx->saved_data["groups"] = conv.groups;
    return {out};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto stride = ctx->saved_data["stride"].toIntVector();
    const auto padding = ctx->saved_data["padding"].toIntVector();
    const auto dilation = ctx->saved_data["dilation"].toIntVector();
    torch::Tensor dy, dconv_weight;
    {
      const auto y = fused::batch_norm_relu_recompute(x, saved[3]);
      std::tie(dy, dconv_weight, std::ignore) =
          at::convolution_backward(grad_outputs[0], y, saved[5], /*bias_sizes=*/c10::nullopt, stride, padding, dilation,
                                   /*transposed=*/false, /*output_padding=*/{0, 0}, ctx->saved_data["groups"].toInt(),
                                   {true, true, false});
    }  // y goes back to the allocator before the batch norm's backward allocates
    auto g = fused::batch_norm_relu_backward(dy, torch::Tensor(), x, saved[1], saved[2], saved[3], saved[4],
                                             /*with_residual=*/false, /*relu=*/true);
    return {g.dx, g.dweight, g.dbias, torch::Tensor(), torch::Tensor(), dconv_weight, torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

bool fused_batch_norm_relu_applies(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& weight,
                                   const torch::Tensor& running_mean) {
  if (!fused::nhwc_vectors(x)) return false;
  if (residual.defined() && (residual.sizes() != x.sizes() || residual.scalar_type() != x.scalar_type() ||
                             !residual.is_contiguous(at::MemoryFormat::ChannelsLast)))
    return false;
  // Affine, with running statistics (what the kernels take), in fp32 or the activations' dtype.
  if (!weight.defined() || !running_mean.defined()) return false;
  if (weight.scalar_type() != torch::kFloat && weight.scalar_type() != x.scalar_type()) return false;
  return weight.scalar_type() == running_mean.scalar_type();
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
  if (residual.defined())
    return FusedBatchNormAddRelu::apply(x, residual, weight, bias, running_mean, running_var, momentum, eps)[0];
  return FusedBatchNormRelu::apply(x, weight, bias, running_mean, running_var, momentum, eps)[0];
}

torch::Tensor batch_norm_training(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                  const torch::Tensor& running_mean, const torch::Tensor& running_var, double momentum,
                                  double eps, bool allow_fused) {
  if (!allow_fused || !fused_batch_norm_relu_applies(x, torch::Tensor(), weight, running_mean))
    return torch::batch_norm(x, weight, bias, running_mean, running_var, /*training=*/true, momentum, eps,
                             at::globalContext().userEnabledCuDNN());
  return FusedBatchNorm::apply(x, weight, bias, running_mean, running_var, momentum, eps)[0];
}

torch::Tensor batch_norm_relu_conv(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                   const torch::Tensor& running_mean, const torch::Tensor& running_var,
                                   double momentum, double eps, const torch::Tensor& conv_weight,
                                   const ConvGeometry& conv, bool allow_fused) {
  if (!allow_fused || !fused_batch_norm_relu_applies(x, torch::Tensor(), weight, running_mean) ||
      conv_weight.scalar_type() != x.scalar_type()) {
    const auto y = reference_batch_norm_relu(x, torch::Tensor(), weight, bias, running_mean, running_var, momentum, eps);
    return torch::conv2d(y, conv_weight, /*bias=*/{}, conv.stride, conv.padding, conv.dilation, conv.groups);
  }
  return FusedBatchNormReluConv::apply(x, weight, bias, running_mean, running_var, conv_weight, momentum, eps, conv)[0];
}

}  // namespace ptrain::kernels
