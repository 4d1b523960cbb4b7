#include "ptrain/kernels/batch_norm_relu.h"

#include <array>

#include <torch/csrc/autograd/custom_function.h>

#include "ptrain/core/error.h"
#include "ptrain/kernels/fused.h"
#include "ptrain/kernels/max_pool.h"
#include "ptrain/kernels/saved_pooling.h"

namespace ptrain::kernels {

namespace {

// The forward kernels: statistics from a pass over x, or from the sums of the convolution that made x (sums
// non-null; a plain pointer, not a tensor input: the sums carry no gradient, the backward differentiates
// through the statistics itself).
fused::BatchNormReluForward forward_kernels(const torch::Tensor& x, const torch::Tensor& residual,
                                            const torch::Tensor& weight, const torch::Tensor& bias,
                                            const torch::Tensor& running_mean, const torch::Tensor& running_var,
                                            double momentum, double eps, bool relu, const ConvStatsResult* sums) {
  if (!sums) return fused::batch_norm_relu_forward(x, residual, weight, bias, running_mean, running_var, momentum, eps, relu);
  auto stats = fused::batch_norm_stats_from_sums(sums->sum, sums->sum_of_squares, x.numel() / x.size(1), weight, bias,
                                                 running_mean, running_var, momentum, eps, torch::kFloat);
  return {fused::batch_norm_relu_apply(x, residual, stats.scale_shift, relu), stats.mean, stats.invstd,
          stats.scale_shift};
}

// Saves x and y (y is the next layer's input, kept anyway; its sign is the ReLU's mask) and the batch's
// statistics: nothing beyond what the unfused layers keep. Two functions, with and without the residual,
// since LibTorch 2.x's custom functions take no undefined tensor as an input.
torch::autograd::variable_list fused_forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                             const torch::Tensor& residual, const torch::Tensor& weight,
                                             const torch::Tensor& bias, const torch::Tensor& running_mean,
                                             const torch::Tensor& running_var, double momentum, double eps,
                                             const ConvStatsResult* sums) {
  auto out = forward_kernels(x, residual, weight, bias, running_mean, running_var, momentum, eps, /*relu=*/true, sums);
  // y only with a residual (the ReLU's mask); without, the mask is recomputed from x and scale_shift.
  ctx->save_for_backward({x, residual.defined() ? out.y : torch::Tensor(), out.mean, out.invstd, out.scale_shift, weight});
  return {out.y};
}

// An output y, and with twin also y.detach(): the same values as a second output, so that autograd hands the
// backward the gradients of y's two uses apart (batch_norm_relu's twin) instead of adding them in a pass of its own.
torch::autograd::variable_list with_twin(const torch::Tensor& y, bool twin) {
  if (twin) return {y, y.detach()};
  return {y};
}

// grad_outputs[1], when the forward returned a twin of y: the gradient of y's second use, which the kernels
// add to grad_outputs[0] as they read both; undefined otherwise.
torch::Tensor twin_gradient(const torch::autograd::variable_list& grad_outputs) {
  return grad_outputs.size() > 1 ? grad_outputs[1] : torch::Tensor();
}

fused::BatchNormReluBackward fused_backward(torch::autograd::AutogradContext* ctx,
                                            const torch::autograd::variable_list& grad_outputs, bool residual) {
  const auto saved = ctx->get_saved_variables();
  return fused::batch_norm_relu_backward(grad_outputs[0], twin_gradient(grad_outputs), saved[1], saved[0], saved[2], saved[3], saved[4],
                                         saved[5], residual, /*relu=*/true);
}

class FusedBatchNormRelu : public torch::autograd::Function<FusedBatchNormRelu> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& weight, const torch::Tensor& bias,
                                                const torch::Tensor& running_mean, const torch::Tensor& running_var,
                                                double momentum, double eps, const ConvStatsResult* sums) {
    return fused_forward(ctx, x, torch::Tensor(), weight, bias, running_mean, running_var, momentum, eps, sums);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto g = fused_backward(ctx, grad_outputs, /*residual=*/false);
    return {g.dx, g.dweight, g.dbias, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// twin: also returns a twin of y (with_twin).
class FusedBatchNormAddRelu : public torch::autograd::Function<FusedBatchNormAddRelu> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& residual, const torch::Tensor& weight,
                                                const torch::Tensor& bias, const torch::Tensor& running_mean,
                                                const torch::Tensor& running_var, double momentum, double eps,
                                                const ConvStatsResult* sums, bool twin) {
    return with_twin(fused_forward(ctx, x, residual, weight, bias, running_mean, running_var, momentum, eps, sums)[0],
                     twin);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto g = fused_backward(ctx, grad_outputs, /*residual=*/true);
    return {g.dx,           g.dresidual,     g.dweight,       g.dbias,        torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// relu(bn(x) + bn2(x2)) in one function: saves x, x2, y and both batch norms' statistics, what the two functions
// it replaces (FusedBatchNormAddRelu and the shortcut's FusedBatchNorm) saved between them. twin: as
// FusedBatchNormAddRelu's.
class FusedBatchNormAddBatchNormRelu : public torch::autograd::Function<FusedBatchNormAddBatchNormRelu> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& weight, const torch::Tensor& bias,
                                                const torch::Tensor& running_mean, const torch::Tensor& running_var,
                                                const torch::Tensor& x2, const torch::Tensor& weight2,
                                                const torch::Tensor& bias2, const torch::Tensor& running_mean2,
                                                const torch::Tensor& running_var2, double momentum, double eps,
                                                double momentum2, double eps2, bool twin) {
    auto out = fused::batch_norm_add_batch_norm_relu_forward(
        x, {weight, bias, running_mean, running_var, momentum, eps}, x2,
        {weight2, bias2, running_mean2, running_var2, momentum2, eps2});
    ctx->save_for_backward({x, x2, out.y, out.stats.mean, out.stats.invstd, out.stats.scale_shift, out.stats2.mean,
                            out.stats2.invstd, out.stats2.scale_shift, weight, weight2});
    return with_twin(out.y, twin);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto g = fused::batch_norm_add_batch_norm_relu_backward(grad_outputs[0], twin_gradient(grad_outputs), saved[2], saved[0], saved[1],
                                                                  {saved[3], saved[4], saved[5]},
                                                                  {saved[6], saved[7], saved[8]}, saved[9], saved[10]);
    const torch::Tensor none;
    return {g.dx, g.dweight, g.dbias, none, none, g.dx2, g.dweight2, g.dbias2, none, none, none, none, none, none, none};
  }
};

// max_pool(relu(bn(x))) in one function: saves x, the statistics and the pooling's positions (a byte an output),
// what the two functions it replaces (FusedBatchNormRelu and FusedMaxPool2d) saved between them.
class FusedBatchNormReluMaxPool : public torch::autograd::Function<FusedBatchNormReluMaxPool> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& weight, const torch::Tensor& bias,
                                                const torch::Tensor& running_mean, const torch::Tensor& running_var,
                                                double momentum, double eps, int64_t kernel, int64_t stride,
                                                int64_t padding) {
    auto out = fused::batch_norm_relu_max_pool_forward(x, {weight, bias, running_mean, running_var, momentum, eps},
                                                       kernel, stride, padding);
    ctx->save_for_backward({x, out.positions, out.stats.mean, out.stats.invstd, out.stats.scale_shift, weight});
    save_pooling(ctx, kernel, stride, padding);
    return {out.y};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const SavedPooling pool = saved_pooling(ctx);
    const auto g = fused::batch_norm_relu_max_pool_backward(grad_outputs[0], saved[1], saved[0],
                                                            {saved[2], saved[3], saved[4]}, saved[5], pool.kernel,
                                                            pool.stride, pool.padding);
    const torch::Tensor none;
    return {g.dx, g.dweight, g.dbias, none, none, none, none, none, none, none};
  }
};

// The output of FusedBatchNormAddRelu, and its twin into *twin when asked.
torch::Tensor add_relu_output(const torch::autograd::variable_list& out, torch::Tensor* twin) {
  if (twin) *twin = out.size() > 1 ? out[1] : torch::Tensor();
  return out[0];
}

// A shortcut's batch norm, no ReLU after it: the same kernels with the mask off; keeps x and the statistics.
class FusedBatchNorm : public torch::autograd::Function<FusedBatchNorm> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& weight, const torch::Tensor& bias,
                                                const torch::Tensor& running_mean, const torch::Tensor& running_var,
                                                double momentum, double eps, const ConvStatsResult* sums) {
    auto out = forward_kernels(x, torch::Tensor(), weight, bias, running_mean, running_var, momentum, eps,
                               /*relu=*/false, sums);
    ctx->save_for_backward({x, out.mean, out.invstd, out.scale_shift, weight});
    return {out.y};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    auto g = fused::batch_norm_relu_backward(grad_outputs[0], torch::Tensor(), torch::Tensor(), saved[0], saved[1],
                                             saved[2], saved[3], saved[4], /*with_residual=*/false, /*relu=*/false);
    return {g.dx, g.dweight, g.dbias, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// The backward of conv(relu(bn(x))) that kept x and the statistics, not relu(bn(x)): recomputes it for the
// convolution's weight gradient, then the batch norm + ReLU's backward. saved: x, mean, invstd, scale_shift,
// weight, conv_weight. Returns dx, dweight, dbias, dconv_weight.
std::array<torch::Tensor, 4> relu_conv_backward(const torch::autograd::variable_list& saved, const torch::Tensor& grad,
                                                at::IntArrayRef stride, at::IntArrayRef padding,
                                                at::IntArrayRef dilation, int64_t groups) {
  const auto& x = saved[0];
  torch::Tensor dy, dconv_weight;
  {
    const auto y = fused::batch_norm_relu_apply(x, torch::Tensor(), saved[3], /*relu=*/true);
    std::tie(dy, dconv_weight, std::ignore) =
        at::convolution_backward(grad, y, saved[5], /*bias_sizes=*/c10::nullopt, stride, padding, dilation,
                                 /*transposed=*/false, /*output_padding=*/{0, 0}, groups, {true, true, false});
  }  // y goes back to the allocator before the batch norm's backward allocates
  auto g = fused::batch_norm_relu_backward(dy, torch::Tensor(), torch::Tensor(), x, saved[1], saved[2], saved[3], saved[4],
                                           /*with_residual=*/false, /*relu=*/true);
  return {g.dx, g.dweight, g.dbias, dconv_weight};
}

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
    const auto g = relu_conv_backward(ctx->get_saved_variables(), grad_outputs[0],
                                      ctx->saved_data["stride"].toIntVector(), ctx->saved_data["padding"].toIntVector(),
                                      ctx->saved_data["dilation"].toIntVector(), ctx->saved_data["groups"].toInt());
    return {g[0], g[1], g[2], torch::Tensor(), torch::Tensor(), g[3], torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// The same with the statistics from the sums of the convolution that made x and the batch norm + ReLU in the
// next convolution's prologue (cuDNN's fused graph), which returns its own output's sums for the batch norm
// after it. Saves what FusedBatchNormReluConv saves, scale_shift rounded as the prologue applied it.
class FusedBatchNormReluConvStats : public torch::autograd::Function<FusedBatchNormReluConvStats> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& weight, const torch::Tensor& bias,
                                                const torch::Tensor& running_mean, const torch::Tensor& running_var,
                                                const torch::Tensor& conv_weight, double momentum, double eps,
                                                int64_t stride, int64_t padding, const ConvStatsResult* sums) {
    const int64_t channels = x.size(1);
    auto bn = fused::batch_norm_stats_from_sums(sums->sum, sums->sum_of_squares, x.numel() / channels, weight, bias,
                                                running_mean, running_var, momentum, eps, x.scalar_type());
    auto out = fused::conv_stats(x, conv_weight, stride, padding, bn.scale_shift_io.narrow(0, 0, channels),
                                 bn.scale_shift_io.narrow(0, channels, channels));
    ctx->mark_non_differentiable({out.sum, out.sum_of_squares});
    ctx->save_for_backward({x, bn.mean, bn.invstd, bn.scale_shift, weight, conv_weight});
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    return {out.y, out.sum, out.sum_of_squares};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const int64_t stride = ctx->saved_data["stride"].toInt(), padding = ctx->saved_data["padding"].toInt();
    const auto g = relu_conv_backward(ctx->get_saved_variables(), grad_outputs[0], {stride, stride},
                                      {padding, padding}, {1, 1}, 1);
    return {g[0],           g[1],           g[2],           torch::Tensor(), torch::Tensor(), g[3],
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
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

torch::Tensor batch_norm_relu(KernelPath path, const torch::Tensor& x, const torch::Tensor& residual,
                              const torch::Tensor& weight, const torch::Tensor& bias, const torch::Tensor& running_mean,
                              const torch::Tensor& running_var, double momentum, double eps, torch::Tensor* twin) {
  if (twin) *twin = torch::Tensor();
  if (path == KernelPath::kReference)
    return reference_batch_norm_relu(x, residual, weight, bias, running_mean, running_var, momentum, eps);
  if (residual.defined())
    return add_relu_output(FusedBatchNormAddRelu::apply(x, residual, weight, bias, running_mean, running_var, momentum,
                                                        eps, static_cast<const ConvStatsResult*>(nullptr), twin != nullptr),
                           twin);
  return FusedBatchNormRelu::apply(x, weight, bias, running_mean, running_var, momentum, eps,
                                   static_cast<const ConvStatsResult*>(nullptr))[0];
}

namespace {

// Whether the fused kernels take bn's parameters: fused_batch_norm_relu_applies looks at the weight and the running
// mean; the kernels read the bias and the running variance in the weight's dtype too.
bool fused_kernels_take(const torch::Tensor& x, const BatchNormParams& bn) {
  if (!fused_batch_norm_relu_applies(x, torch::Tensor(), bn.weight, bn.running_mean)) return false;
  const auto dtype = bn.weight.scalar_type();
  return bn.bias.defined() && bn.bias.scalar_type() == dtype && bn.running_var.defined() &&
         bn.running_var.scalar_type() == dtype;
}

}  // namespace

bool fused_batch_norm_relu_max_pool_applies(const torch::Tensor& x, const BatchNormParams& bn, int64_t kernel,
                                            int64_t stride, int64_t padding) {
  return fused_kernels_take(x, bn) && fused_max_pool2d_applies(x, kernel, stride, padding);
}

torch::Tensor batch_norm_relu_max_pool(KernelPath path, const torch::Tensor& x, const BatchNormParams& bn,
                                       int64_t kernel, int64_t stride, int64_t padding) {
  if (path == KernelPath::kReference) {
    const auto y = reference_batch_norm_relu(x, torch::Tensor(), bn.weight, bn.bias, bn.running_mean, bn.running_var,
                                             bn.momentum, bn.eps);
    return max_pool2d(y, kernel, stride, padding, /*allow_fused=*/false);
  }
  return FusedBatchNormReluMaxPool::apply(x, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.momentum, bn.eps,
                                          kernel, stride, padding)[0];
}

bool fused_batch_norm_add_batch_norm_relu_applies(const torch::Tensor& x, const BatchNormParams& bn,
                                                  const torch::Tensor& x2, const BatchNormParams& bn2) {
  return fused_kernels_take(x, bn) && fused_kernels_take(x2, bn2) && x2.sizes() == x.sizes() &&
         x2.scalar_type() == x.scalar_type() && bn2.weight.scalar_type() == bn.weight.scalar_type();
}

torch::Tensor batch_norm_add_batch_norm_relu(KernelPath path, const torch::Tensor& x, const BatchNormParams& bn,
                                             const torch::Tensor& x2, const BatchNormParams& bn2, torch::Tensor* twin) {
  if (twin) *twin = torch::Tensor();
  if (path == KernelPath::kReference) {
    const auto shortcut = torch::batch_norm(x2, bn2.weight, bn2.bias, bn2.running_mean, bn2.running_var,
                                            /*training=*/true, bn2.momentum, bn2.eps,
                                            at::globalContext().userEnabledCuDNN());
    return reference_batch_norm_relu(x, shortcut, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.momentum,
                                     bn.eps);
  }
  return add_relu_output(FusedBatchNormAddBatchNormRelu::apply(x, bn.weight, bn.bias, bn.running_mean, bn.running_var, x2,
                                                               bn2.weight, bn2.bias, bn2.running_mean, bn2.running_var,
                                                               bn.momentum, bn.eps, bn2.momentum, bn2.eps,
                                                               twin != nullptr),
                         twin);
}

torch::Tensor batch_norm_training(KernelPath path, const torch::Tensor& x, const torch::Tensor& weight,
                                  const torch::Tensor& bias, const torch::Tensor& running_mean,
                                  const torch::Tensor& running_var, double momentum, double eps) {
  if (path == KernelPath::kReference)
    return torch::batch_norm(x, weight, bias, running_mean, running_var, /*training=*/true, momentum, eps,
                             at::globalContext().userEnabledCuDNN());
  return FusedBatchNorm::apply(x, weight, bias, running_mean, running_var, momentum, eps,
                               static_cast<const ConvStatsResult*>(nullptr))[0];
}

torch::Tensor batch_norm_relu_conv(KernelPath path, const torch::Tensor& x, const torch::Tensor& weight,
                                   const torch::Tensor& bias, const torch::Tensor& running_mean,
                                   const torch::Tensor& running_var, double momentum, double eps,
                                   const torch::Tensor& conv_weight, const ConvGeometry& conv) {
  if (path == KernelPath::kReference) {
    const auto y = reference_batch_norm_relu(x, torch::Tensor(), weight, bias, running_mean, running_var, momentum, eps);
    return torch::conv2d(y, conv_weight, /*bias=*/{}, conv.stride, conv.padding, conv.dilation, conv.groups);
  }
  check(conv_weight.scalar_type() == x.scalar_type(),
        "batch_norm_relu_conv: the fused kernels take the convolution's weight in the activations' dtype");
  return FusedBatchNormReluConv::apply(x, weight, bias, running_mean, running_var, conv_weight, momentum, eps, conv)[0];
}

torch::Tensor batch_norm_relu(KernelPath path, const ConvStatsResult& in, const torch::Tensor& residual,
                              const torch::Tensor& weight, const torch::Tensor& bias, const torch::Tensor& running_mean,
                              const torch::Tensor& running_var, double momentum, double eps, torch::Tensor* twin) {
  if (twin) *twin = torch::Tensor();
  if (path == KernelPath::kReference)
    return reference_batch_norm_relu(in.y, residual, weight, bias, running_mean, running_var, momentum, eps);
  if (residual.defined())
    return add_relu_output(FusedBatchNormAddRelu::apply(in.y, residual, weight, bias, running_mean, running_var,
                                                        momentum, eps, &in, twin != nullptr),
                           twin);
  return FusedBatchNormRelu::apply(in.y, weight, bias, running_mean, running_var, momentum, eps, &in)[0];
}

torch::Tensor batch_norm_training(KernelPath path, const ConvStatsResult& in, const torch::Tensor& weight,
                                  const torch::Tensor& bias, const torch::Tensor& running_mean,
                                  const torch::Tensor& running_var, double momentum, double eps) {
  if (path == KernelPath::kReference)
    return torch::batch_norm(in.y, weight, bias, running_mean, running_var, /*training=*/true, momentum, eps,
                             at::globalContext().userEnabledCuDNN());
  return FusedBatchNorm::apply(in.y, weight, bias, running_mean, running_var, momentum, eps, &in)[0];
}

ConvStatsResult batch_norm_relu_conv_with_stats(KernelPath path, const ConvStatsResult& in, const torch::Tensor& weight,
                                                const torch::Tensor& bias, const torch::Tensor& running_mean,
                                                const torch::Tensor& running_var, double momentum, double eps,
                                                const torch::Tensor& conv_weight, int64_t stride, int64_t padding) {
  if (path == KernelPath::kReference || conv_weight.scalar_type() != in.y.scalar_type() ||
      !conv_stats_fused_applies(in.y, conv_weight, stride, padding, /*prologue=*/true))
    return conv_with_stats(
        batch_norm_relu(path, in, torch::Tensor(), weight, bias, running_mean, running_var, momentum, eps),
        conv_weight, stride, padding);
  auto out = FusedBatchNormReluConvStats::apply(in.y, weight, bias, running_mean, running_var, conv_weight, momentum,
                                                eps, stride, padding, &in);
  return {out[0], out[1], out[2]};
}

}  // namespace ptrain::kernels
