#include "ptrain/kernels/stem_conv.h"

#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/kernels/fused.h"

namespace ptrain::kernels {

namespace {

int64_t regrouped_channels(int64_t channels) { return (4 * channels + 7) / 8 * 8; }

// The convolution's dtype: autocast's for a float input under autocast, else the input's.
c10::ScalarType conv_dtype(const torch::Tensor& x) {
  if (x.scalar_type() == torch::kFloat && compat::autocast_enabled(x.device().type()))
    return compat::autocast_dtype(x.device().type());
  return x.scalar_type();
}

// x [N, C, H, W] and weight [K, C, 7, 7].
bool stem_shapes(const torch::Tensor& x, const torch::Tensor& weight) {
  return x.dim() == 4 && weight.dim() == 4 && weight.size(1) == x.size(1) && weight.size(2) == 7 && weight.size(3) == 7;
}

void check_stem(const torch::Tensor& x, const torch::Tensor& weight) {
  check(stem_shapes(x, weight), "stem_conv_space_to_depth: needs x [N, C, H, W] and weight [K, C, 7, 7], got " +
                                    c10::str(x.sizes()) + " and " + c10::str(weight.sizes()));
  check(!x.requires_grad(), "stem_conv_space_to_depth: x must not require a gradient (the regrouping has no backward)");
}

}  // namespace

torch::Tensor stem_space_to_depth_input(const torch::Tensor& x, c10::ScalarType dtype, bool allow_fused) {
  check(x.dim() == 4, "stem_space_to_depth_input: x must be [N, C, H, W], got " + c10::str(x.sizes()));
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t channels = regrouped_channels(c);
  const int64_t out_h = (h - 1) / 2 + 4, out_w = (w - 1) / 2 + 4;
  if (allow_fused && fused::available(x.device()) && fused::kernel_dtype(x.scalar_type()) &&
      fused::kernel_dtype(dtype)) {
    return fused::space_to_depth(x, channels, out_h, out_w, dtype);
  }
  // Rows and columns -4 .. 2 * out - 5 of x, so that 2x2 patch i covers rows 2i - 4 and 2i - 3.
  const auto padded = torch::constant_pad_nd(x, {4, 2 * out_w - 4 - w, 4, 2 * out_h - 4 - h}).contiguous();
  auto regrouped = padded.view({n, c, out_h, 2, out_w, 2}).permute({0, 3, 5, 1, 2, 4}).reshape({n, 4 * c, out_h, out_w});
  if (channels > 4 * c) regrouped = torch::constant_pad_nd(regrouped, {0, 0, 0, 0, 0, channels - 4 * c});
  return regrouped.to(dtype).contiguous(at::MemoryFormat::ChannelsLast);
}

torch::Tensor stem_space_to_depth_weight(const torch::Tensor& weight) {
  check(weight.dim() == 4 && weight.size(2) == 7 && weight.size(3) == 7,
        "stem_space_to_depth_weight: weight must be [K, C, 7, 7], got " + c10::str(weight.sizes()));
  const int64_t k = weight.size(0), c = weight.size(1);
  const int64_t channels = regrouped_channels(c);
  // Tap u of the 7 becomes 8-tap index u + 1 = 2a + s: a the 4x4 kernel's tap, s the patch row (likewise b, t).
  auto regrouped = torch::constant_pad_nd(weight, {1, 0, 1, 0})
                       .reshape({k, c, 4, 2, 4, 2})
                       .permute({0, 3, 5, 1, 2, 4})
                       .reshape({k, 4 * c, 4, 4});
  if (channels > 4 * c) regrouped = torch::constant_pad_nd(regrouped, {0, 0, 0, 0, 0, channels - 4 * c});
  return regrouped.contiguous(at::MemoryFormat::ChannelsLast);
}

torch::Tensor stem_conv_space_to_depth(const torch::Tensor& x, const torch::Tensor& weight, bool allow_fused) {
  check_stem(x, weight);
  const auto input = stem_space_to_depth_input(x, conv_dtype(x), allow_fused);
  return torch::conv2d(input, stem_space_to_depth_weight(weight));
}

bool stem_space_to_depth_pays(const torch::Tensor& x, const torch::Tensor& weight) {
  return x.is_cuda() && !x.requires_grad() && stem_shapes(x, weight) && conv_dtype(x) == torch::kBFloat16;
}

}  // namespace ptrain::kernels
