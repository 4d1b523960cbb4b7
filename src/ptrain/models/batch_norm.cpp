#include "ptrain/models/batch_norm.h"

#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/kernels/batch_norm_relu.h"
#include "ptrain/kernels/max_pool.h"
#include "ptrain/kernels/parameter_cast.h"

namespace ptrain::models {

BatchNorm2dImpl::BatchNorm2dImpl(const torch::nn::BatchNormOptions& options_) : options(options_) {
  // Registration order is torch's (and so torchvision's state_dict order): parameters, then buffers.
  if (options.affine()) {
    weight = register_parameter("weight", torch::ones({options.num_features()}));
    bias = register_parameter("bias", torch::zeros({options.num_features()}));
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", torch::zeros({options.num_features()}));
    running_var = register_buffer("running_var", torch::ones({options.num_features()}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::tensor(0, torch::kLong));
  }
}

double BatchNorm2dImpl::count_batch_and_momentum() {
  {
    torch::NoGradGuard no_grad;
    num_batches_tracked += 1;
  }
  return options.momentum() ? *options.momentum() : 1.0 / num_batches_tracked.item<double>();
}

void BatchNorm2dImpl::require_values_to_normalise(const torch::Tensor& x) const {
  TORCH_CHECK(x.dim() != 4 || x.size(0) * x.size(2) * x.size(3) != 1,
              "BatchNorm2d: expected more than 1 value per channel when training, got input size ", x.sizes());
}

torch::Tensor BatchNorm2dImpl::local_forward(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 4, "BatchNorm2d: expected a 4-D input (N, C, H, W), got ", x.dim(), "-D");
  if (is_training()) require_values_to_normalise(x);
  const bool tracking = tracks_running_stats();
  const double momentum = is_training() && tracking ? count_batch_and_momentum() : 0.0;
  return torch::batch_norm(x, weight, bias, running_mean, running_var, is_training() || !tracking, momentum,
                           options.eps(), at::globalContext().userEnabledCuDNN());
}

bool BatchNorm2dImpl::fused_applies(const torch::Tensor& x, const torch::Tensor& residual) const {
  if (!fused_kernels_ || normalize_ || !is_training() || !tracks_running_stats() || x.dim() != 4) return false;
  require_values_to_normalise(x);
  return kernels::fused_batch_norm_relu_applies(x, residual, weight, running_mean);
}

torch::Tensor BatchNorm2dImpl::forward(const torch::Tensor& x) {
  if (normalize_) return normalize_(*this, x);
  if (!fused_applies(x, torch::Tensor())) return local_forward(x);
  const double momentum = count_batch_and_momentum();
  return kernels::batch_norm_training(kernels::KernelPath::kFused, x, weight, bias, running_mean, running_var, momentum,
                                      options.eps());
}

torch::Tensor BatchNorm2dImpl::forward_relu(const torch::Tensor& x, const torch::Tensor& residual, torch::Tensor* twin) {
  if (twin) *twin = torch::Tensor();
  if (!fused_applies(x, residual)) {
    auto y = forward(x);
    return torch::relu(residual.defined() ? y + residual : y);
  }
  const double momentum = count_batch_and_momentum();
  return kernels::batch_norm_relu(kernels::KernelPath::kFused, x, residual, weight, bias, running_mean, running_var,
                                  momentum, options.eps(), twin);
}

torch::Tensor BatchNorm2dImpl::forward_relu_max_pool(const torch::Tensor& x, int64_t kernel, int64_t stride,
                                                     int64_t padding) {
  const auto params = [&](double momentum) {
    return kernels::BatchNormParams{weight, bias, running_mean, running_var, momentum, options.eps()};
  };
  if (!fusions_.stem_pool || !fused_applies(x, torch::Tensor()) ||
      !kernels::fused_batch_norm_relu_max_pool_applies(x, params(0.0), kernel, stride, padding))
    return kernels::max_pool2d(forward_relu(x), kernel, stride, padding, fused_kernels_ && is_training());
  return kernels::batch_norm_relu_max_pool(kernels::KernelPath::kFused, x, params(count_batch_and_momentum()), kernel,
                                           stride, padding);
}

torch::Tensor BatchNorm2dImpl::forward_relu_add_norm(const torch::Tensor& x, BatchNorm2dImpl& shortcut_norm,
                                                     const torch::Tensor& shortcut_x, torch::Tensor* twin) {
  const auto params = [](const BatchNorm2dImpl& norm, double momentum) {
    return kernels::BatchNormParams{norm.weight, norm.bias, norm.running_mean, norm.running_var, momentum,
                                    norm.options.eps()};
  };
  const bool fused = fusions_.shortcut_norms && fused_applies(x, torch::Tensor()) &&
                     shortcut_norm.fused_applies(shortcut_x, torch::Tensor()) &&
                     kernels::fused_batch_norm_add_batch_norm_relu_applies(x, params(*this, 0.0), shortcut_x,
                                                                           params(shortcut_norm, 0.0));
  if (!fused) return forward_relu(x, shortcut_norm.forward(shortcut_x), twin);
  const double momentum2 = shortcut_norm.count_batch_and_momentum();
  const double momentum = count_batch_and_momentum();
  return kernels::batch_norm_add_batch_norm_relu(kernels::KernelPath::kFused, x, params(*this, momentum), shortcut_x,
                                                 params(shortcut_norm, momentum2), twin);
}

torch::Tensor BatchNorm2dImpl::forward_relu_conv(const torch::Tensor& x, torch::nn::Conv2dImpl& conv) {
  const auto& o = conv.options;
  const auto padding = compat::explicit_zero_padding(o);
  const bool fused = relu_recompute_ && !o.bias() && padding.has_value() && fused_applies(x, torch::Tensor());
  if (!fused) return kernels::forward_with_casts(conv, forward_relu(x));
  kernels::ConvGeometry geometry;
  geometry.stride = std::vector<int64_t>(o.stride()->begin(), o.stride()->end());
  geometry.padding = *padding;
  geometry.dilation = std::vector<int64_t>(o.dilation()->begin(), o.dilation()->end());
  geometry.groups = o.groups();
  const auto conv_weight = conv_weight_like(conv, x);
  const double momentum = count_batch_and_momentum();
  return kernels::batch_norm_relu_conv(kernels::KernelPath::kFused, x, weight, bias, running_mean, running_var, momentum,
                                       options.eps(), conv_weight, geometry);
}

torch::Tensor BatchNorm2dImpl::conv_weight_like(const torch::nn::Conv2dImpl& conv, const torch::Tensor& x) {
  const auto weight = kernels::ParameterCastScope::cast_of(conv.weight);
  return weight.scalar_type() == x.scalar_type() ? weight : weight.to(x.scalar_type());
}

void BatchNorm2dImpl::require_conv_stats(const torch::Tensor& y) const {
  check(accepts_conv_stats(y), "BatchNorm2d: statistics from a convolution are taken only in training with the "
                               "fused kernels and the convolution + batch norm fusion on");
}

torch::Tensor BatchNorm2dImpl::forward_from_stats(const kernels::ConvStatsResult& in) {
  require_conv_stats(in.y);
  const double momentum = count_batch_and_momentum();
  return kernels::batch_norm_training(kernels::KernelPath::kFused, in, weight, bias, running_mean, running_var, momentum,
                                      options.eps());
}

torch::Tensor BatchNorm2dImpl::forward_relu_from_stats(const kernels::ConvStatsResult& in,
                                                       const torch::Tensor& residual, torch::Tensor* twin) {
  require_conv_stats(in.y);
  const auto path = kernels::fused_if(fused_applies(in.y, residual));
  const double momentum = count_batch_and_momentum();
  return kernels::batch_norm_relu(path, in, residual, weight, bias, running_mean, running_var, momentum, options.eps(),
                                  twin);
}

kernels::ConvStatsResult BatchNorm2dImpl::forward_relu_conv_from_stats(const kernels::ConvStatsResult& in,
                                                                       torch::nn::Conv2dImpl& conv) {
  require_conv_stats(in.y);
  const auto& o = conv.options;
  const auto padding = compat::explicit_zero_padding(o);
  check(!o.bias() && padding && (*padding)[0] == (*padding)[1] && (*o.stride())[0] == (*o.stride())[1] &&
            (*o.dilation())[0] == 1 && (*o.dilation())[1] == 1 && o.groups() == 1,
        "BatchNorm2d: the fused convolution takes no bias, dilation or groups, and square stride and zero padding");
  const double momentum = count_batch_and_momentum();
  return kernels::batch_norm_relu_conv_with_stats(kernels::KernelPath::kFused, in, weight, bias, running_mean,
                                                  running_var, momentum, options.eps(),
                                                  conv_weight_like(conv, in.y), (*o.stride())[0], (*padding)[0]);
}

}  // namespace ptrain::models
