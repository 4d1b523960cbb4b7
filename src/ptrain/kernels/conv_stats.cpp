#include "ptrain/kernels/conv_stats.h"

#include <torch/csrc/autograd/custom_function.h>

#include "ptrain/core/error.h"
#include "ptrain/kernels/fused.h"

namespace ptrain::kernels {

namespace {

void check_arguments(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride, int64_t padding,
                     const torch::Tensor& scale, const torch::Tensor& shift) {
  check(x.defined() && x.dim() == 4, "conv_stats: x must be [N, C, H, W], got " +
                                         (x.defined() ? c10::str(x.sizes()) : std::string("an undefined tensor")));
  check(weight.defined() && weight.dim() == 4 && weight.size(1) == x.size(1),
        "conv_stats: weight must be [K, C, R, S] with x's C = " + std::to_string(x.size(1)) + ", got " +
            (weight.defined() ? c10::str(weight.sizes()) : std::string("an undefined tensor")));
  check(stride >= 1 && padding >= 0, "conv_stats: stride must be >= 1 and padding >= 0, got stride " +
                                          std::to_string(stride) + ", padding " + std::to_string(padding));
  check(scale.defined() == shift.defined(), "conv_stats: scale and shift come together");
  if (scale.defined())
    check(scale.numel() == x.size(1) && shift.numel() == x.size(1),
          "conv_stats: scale and shift must hold one value per input channel (" + std::to_string(x.size(1)) +
              "), got " + std::to_string(scale.numel()) + " and " + std::to_string(shift.numel()));
}

// y's sum and sum of squares per output channel, accumulated in fp32: the statistics LibTorch's ops give.
void channel_sums(const torch::Tensor& y, ConvStatsResult* out) {
  const auto y32 = y.to(torch::kFloat);
  out->sum = y32.sum({0, 2, 3});
  out->sum_of_squares = y32.square().sum({0, 2, 3});
}

// Whether the fused graph runs for these arguments; precompiled_only as fused::conv_stats_supported.
bool fused_graph_runs(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride, int64_t padding,
                      bool prologue, std::string* why_not, bool precompiled_only) {
  if (!fused::available(x.device())) {
    if (why_not) *why_not = "no fused kernels for " + x.device().str() + " in this build";
    return false;
  }
  return fused::conv_stats_supported(x, weight, stride, padding, prologue, why_not, precompiled_only);
}

// The fused graph's output, with the convolution's backward.
class ConvWithStats : public torch::autograd::Function<ConvWithStats> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& weight, int64_t stride, int64_t padding) {
    auto out = fused::conv_stats(x, weight, stride, padding, torch::Tensor(), torch::Tensor());
    ctx->mark_non_differentiable({out.sum, out.sum_of_squares});
    ctx->save_for_backward({x, weight});
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    return {out.y, out.sum, out.sum_of_squares};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const int64_t stride = ctx->saved_data["stride"].toInt(), padding = ctx->saved_data["padding"].toInt();
    auto [dx, dweight, unused] = at::convolution_backward(
        grad_outputs[0], saved[0], saved[1], /*bias_sizes=*/c10::nullopt, {stride, stride}, {padding, padding}, {1, 1},
        /*transposed=*/false, /*output_padding=*/{0, 0}, /*groups=*/1,
        {ctx->needs_input_grad(0), ctx->needs_input_grad(1), false});
    return {dx, dweight, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

ConvStatsResult conv_stats_reference(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride,
                                     int64_t padding, const torch::Tensor& scale, const torch::Tensor& shift) {
  check_arguments(x, weight, stride, padding, scale, shift);
  torch::Tensor input = x;
  if (scale.defined()) {
    const auto per_channel = [&](const torch::Tensor& t) { return t.reshape({1, -1, 1, 1}).to(torch::kFloat); };
    input = torch::relu(x.to(torch::kFloat) * per_channel(scale) + per_channel(shift)).to(x.scalar_type());
  }
  ConvStatsResult out;
  out.y = torch::conv2d(input, weight, {}, stride, padding);
  channel_sums(out.y, &out);
  return out;
}

bool conv_stats_fused_applies(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride, int64_t padding,
                              bool prologue, std::string* why_not) {
  return fused_graph_runs(x, weight, stride, padding, prologue, why_not, /*precompiled_only=*/false);
}

bool conv_stats_fused_fast(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride, int64_t padding,
                           bool prologue, std::string* why_not) {
  return fused_graph_runs(x, weight, stride, padding, prologue, why_not, /*precompiled_only=*/true);
}

ConvStatsResult conv_with_stats(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride, int64_t padding) {
  check_arguments(x, weight, stride, padding, {}, {});
  if (!conv_stats_fused_applies(x, weight, stride, padding, /*prologue=*/false)) {
    ConvStatsResult out;
    out.y = torch::conv2d(x, weight, {}, stride, padding);
    channel_sums(out.y.detach(), &out);  // no gradient through the sums, as from the fused graph
    return out;
  }
  auto out = ConvWithStats::apply(x, weight, stride, padding);
  return {out[0], out[1], out[2]};
}

ConvStatsResult conv_stats(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride, int64_t padding,
                           const torch::Tensor& scale, const torch::Tensor& shift) {
  check_arguments(x, weight, stride, padding, scale, shift);
  if (!conv_stats_fused_applies(x, weight, stride, padding, scale.defined()))
    return conv_stats_reference(x, weight, stride, padding, scale, shift);
  auto fused_out = fused::conv_stats(x, weight, stride, padding, scale, shift);
  return {fused_out.y, fused_out.sum, fused_out.sum_of_squares};
}

}  // namespace ptrain::kernels
