#include "ptrain/kernels/parameter_cast.h"

#include <torch/csrc/autograd/custom_function.h>

#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/kernels/fused.h"

namespace ptrain::kernels {

namespace {

// Each tensor's place in a group's buffer starts at a multiple of this many elements (256 bytes in a 16-bit
// dtype), so that the casts are as aligned as tensors of their own, which the convolutions' kernels may prefer.
constexpr int64_t kAlignment = 128;

int64_t aligned(int64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

// A tensor over buffer's memory from element offset on, in sizes and strides: no autograd view of buffer, so that
// autograd treats it as a tensor of its own (AccumulateGrad takes it as the gradient as it is).
torch::Tensor alias(const torch::Tensor& buffer, int64_t offset, at::IntArrayRef sizes, at::IntArrayRef strides) {
  auto out = torch::empty({0}, buffer.options());
  out.set_(buffer.storage(), buffer.storage_offset() + offset, sizes, strides);
  return out;
}

// Whether dense t's elements lie in memory as strides lay them out: its strides are those wherever a dimension holds
// more than one element. A size-1 dimension's stride says nothing: cuDNN hands a 1x1 convolution's weight gradient
// channels-last strides, (C, 1, C, C), where its parameter has (C, 1, 1, 1); the same memory, which a copy would
// only move.
bool laid_out_as(const torch::Tensor& t, at::IntArrayRef strides) {
  if (!t.is_non_overlapping_and_dense()) return false;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) != 1 && t.stride(d) != strides[d]) return false;
  return true;
}

void cast_pairs(const std::vector<torch::Tensor>& src, const std::vector<torch::Tensor>& dst, bool allow_fused) {
  if (src.empty()) return;
  if (allow_fused && fused::available(src[0].device()) && fused::kernel_dtype(src[0].scalar_type()) &&
      fused::kernel_dtype(dst[0].scalar_type())) {
    fused::cast_tensors(src, dst);
    return;
  }
  for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
}

// Forward: the casts into one buffer. Backward: the gradients that arrived, cast back into one buffer (each in
// its parameter's strides), the others left undefined (no gradient, as for a cast that was never used).
class CastParameters : public torch::autograd::Function<CastParameters> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList params,
                                                int64_t dtype, bool allow_fused) {
    const auto to = static_cast<c10::ScalarType>(dtype);
    std::vector<int64_t> offsets;
    int64_t total = 0;
    for (const auto& p : params) {
      offsets.push_back(total);
      total += aligned(p.numel());
    }
    const auto buffer = torch::empty({total}, params[0].options().dtype(to));
    std::vector<torch::Tensor> sources(params.begin(), params.end()), casts;
    for (size_t i = 0; i < params.size(); ++i)
      casts.push_back(alias(buffer, offsets[i], params[i].sizes(), params[i].strides()));
    cast_pairs(sources, casts, allow_fused);
    // What the backward needs of each parameter: its place in a buffer, its sizes and strides (as [dim, sizes...,
    // strides...] one after another), and the parameters' dtype.
    std::vector<int64_t> layouts;
    for (const auto& p : params) {
      layouts.push_back(p.dim());
      layouts.insert(layouts.end(), p.sizes().begin(), p.sizes().end());
      layouts.insert(layouts.end(), p.strides().begin(), p.strides().end());
    }
    ctx->saved_data["layouts"] = layouts;
    ctx->saved_data["offsets"] = offsets;
    ctx->saved_data["total"] = total;
    ctx->saved_data["dtype"] = static_cast<int64_t>(params[0].scalar_type());
    ctx->saved_data["allow_fused"] = allow_fused;
    ctx->set_materialize_grads(false);
    return casts;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto layouts = ctx->saved_data["layouts"].toIntVector();
    const auto offsets = ctx->saved_data["offsets"].toIntVector();
    const auto dtype = static_cast<c10::ScalarType>(ctx->saved_data["dtype"].toInt());
    torch::autograd::variable_list out(grads.size() + 2);
    std::vector<size_t> arrived;
    for (size_t i = 0; i < grads.size(); ++i)
      if (grads[i].defined()) arrived.push_back(i);
    if (arrived.empty()) return out;
    const auto& any = grads[arrived[0]];
    const auto buffer = torch::empty({ctx->saved_data["total"].toInt()}, any.options().dtype(dtype));
    std::vector<at::IntArrayRef> sizes, strides;
    for (size_t at = 0; at < layouts.size(); at += 1 + 2 * static_cast<size_t>(layouts[at])) {
      const auto* dims = layouts.data() + at + 1;
      sizes.emplace_back(dims, layouts[at]);
      strides.emplace_back(dims + layouts[at], layouts[at]);
    }
    std::vector<torch::Tensor> sources, destinations;
    for (const size_t i : arrived) {
      auto grad = grads[i];
      if (!laid_out_as(grad, strides[i]))
        grad = torch::empty_strided(sizes[i], strides[i], grad.options()).copy_(grad);
      else if (grad.strides() != strides[i])
        grad = grad.as_strided(sizes[i], strides[i], grad.storage_offset());
      sources.push_back(grad);
      destinations.push_back(alias(buffer, offsets[i], sizes[i], strides[i]));
      out[i] = destinations.back();
    }
    cast_pairs(sources, destinations, ctx->saved_data["allow_fused"].toBool());
    return out;
  }
};

thread_local ParameterCastScope* innermost = nullptr;

}  // namespace

std::vector<torch::Tensor> cast_parameters(const std::vector<torch::Tensor>& params, c10::ScalarType dtype,
                                           bool allow_fused) {
  if (params.empty()) return {};
  for (const auto& p : params) {
    check(p.defined() && p.device() == params[0].device() && p.scalar_type() == params[0].scalar_type(),
          "cast_parameters: the parameters must be tensors of one device and one dtype");
    check(p.is_non_overlapping_and_dense(), "cast_parameters: a parameter of shape " + c10::str(p.sizes()) +
                                                " and strides " + c10::str(p.strides()) + " is not dense");
  }
  return CastParameters::apply(at::TensorList(params), static_cast<int64_t>(dtype), allow_fused);
}

namespace {

// The casts autocast would make of params for activations on device, grouped, keyed by the parameters.
std::vector<std::pair<const c10::TensorImpl*, torch::Tensor>> autocast_casts(const std::vector<torch::Tensor>& params,
                                                                           const torch::Device& device,
                                                                           bool allow_fused) {
  if (!compat::autocast_enabled(device.type())) return {};
  const auto dtype = compat::autocast_dtype(device.type());
  if (dtype != torch::kHalf && dtype != torch::kBFloat16) return {};
  // A frozen parameter keeps autocast's own cast while gradients are recorded: in a group its cast would require a
  // gradient, as every output of a function with one input that does, and its layer would compute one for nothing.
  const bool recording = torch::GradMode::is_enabled();
  std::vector<torch::Tensor> group;
  for (const auto& p : params) {
    if (p.defined() && p.device() == device && p.scalar_type() == torch::kFloat && p.is_non_overlapping_and_dense() &&
        (!recording || p.requires_grad()))
      group.push_back(p);
  }
  const auto casts = cast_parameters(group, dtype, allow_fused);
  std::vector<std::pair<const c10::TensorImpl*, torch::Tensor>> keyed;
  for (size_t i = 0; i < group.size(); ++i) keyed.emplace_back(group[i].unsafeGetTensorImpl(), casts[i]);
  return keyed;
}

}  // namespace

ParameterCastScope::ParameterCastScope(const std::vector<torch::Tensor>& params, const torch::Device& device,
                                       bool allow_fused)
    : casts_(autocast_casts(params, device, allow_fused)), outer_(innermost) {
  innermost = this;
}

ParameterCastScope::~ParameterCastScope() { innermost = outer_; }

torch::Tensor ParameterCastScope::cast_of(const torch::Tensor& param) {
  if (!param.defined()) return param;
  for (const ParameterCastScope* scope = innermost; scope != nullptr; scope = scope->outer_) {
    for (const auto& [impl, cast] : scope->casts_)
      if (impl == param.unsafeGetTensorImpl()) return cast;
  }
  return param;
}

torch::Tensor forward_with_casts(torch::nn::Conv2dImpl& conv, const torch::Tensor& x) {
  const auto weight = ParameterCastScope::cast_of(conv.weight);
  const auto padding = compat::explicit_zero_padding(conv.options);
  if (weight.is_same(conv.weight) || !padding) return conv.forward(x);
  const auto& o = conv.options;
  return torch::conv2d(x, weight, ParameterCastScope::cast_of(conv.bias), *o.stride(), *padding, *o.dilation(), o.groups());
}

torch::Tensor forward_with_casts(torch::nn::LinearImpl& linear, const torch::Tensor& x) {
  const auto weight = ParameterCastScope::cast_of(linear.weight);
  if (weight.is_same(linear.weight)) return linear.forward(x);
  return torch::linear(x, weight, ParameterCastScope::cast_of(linear.bias));
}

}  // namespace ptrain::kernels
