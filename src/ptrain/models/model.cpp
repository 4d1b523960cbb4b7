#include "ptrain/models/model.h"

#include <algorithm>

#include "ptrain/core/error.h"
#include "ptrain/core/text.h"
#include "ptrain/core/torch_compat.h"

namespace ptrain::models {

std::shared_ptr<Model> Model::make_replica() const {
  throw Error("model '" + name() + "' cannot make replicas of itself, which --strategy dp needs");
}

const std::vector<std::string>& fusion_names() {
  static const std::vector<std::string> names = {"weight-casts",   "shortcut-norms", "stem-pool",     "residual-twins",
                                                 "bias-gradients", "residual-adds",  "fp8-amax"};
  return names;
}

FusionChoices fusions_skipping(const std::vector<std::string>& names) {
  FusionChoices choices;
  bool* const flags[] = {&choices.weight_casts, &choices.shortcut_norms, &choices.stem_pool, &choices.residual_twins,
                         &choices.bias_gradients, &choices.residual_adds, &choices.fp8_amax};
  const auto& known = fusion_names();
  for (const auto& name : names) {
    const auto at = std::find(known.begin(), known.end(), name);
    if (at == known.end())
      throw Error("--skip-fusions: '" + name + "' is not a fusion (the fusions: " + join(known, ", ") + ")");
    *flags[at - known.begin()] = false;
  }
  return choices;
}

std::string describe_fp8_layers(const Fp8Layers& layers) {
  return "linear layers in FP8: " + std::to_string(layers.fp8) + ", kept in bf16: " + std::to_string(layers.kept) +
         (layers.why.empty() ? "" : " (" + layers.why + ")");
}

Fp8Layers Model::set_fp8_linear(bool on, const Fp8Options& /*options*/) {
  Fp8Layers layers;
  if (!on) return layers;
  for (const auto& m : modules(/*include_self=*/false)) {
    if (m->as<torch::nn::Conv2dImpl>() || m->as<torch::nn::LinearImpl>() || m->as<torch::nn::Conv1dImpl>()) ++layers.kept;
  }
  layers.why = "no FP8 path in " + name() +
               ": its convolutions and linear layers run in bf16 under autocast (cuDNN's FP8 convolutions are not used)";
  return layers;
}

double conv2d_forward_flops(const torch::nn::Conv2dImpl& conv, int64_t& height, int64_t& width) {
  const auto& o = conv.options;
  const auto padding = compat::explicit_zero_padding(o);
  check(padding.has_value(), "a convolution's FLOPs: only explicit zero padding is counted");
  const int64_t sizes[2] = {height, width};
  int64_t out[2];
  for (int d = 0; d < 2; ++d) {
    const int64_t span = (*o.dilation())[d] * ((*o.kernel_size())[d] - 1) + 1;
    out[d] = (sizes[d] + 2 * (*padding)[d] - span) / (*o.stride())[d] + 1;
  }
  height = out[0];
  width = out[1];
  const double macs_per_output = static_cast<double>(o.in_channels() / o.groups()) * (*o.kernel_size())[0] *
                                 (*o.kernel_size())[1] * static_cast<double>(o.out_channels());
  return 2.0 * macs_per_output * static_cast<double>(out[0] * out[1]);
}

void to_floating_point(torch::nn::Module& module, const c10::optional<torch::Device>& device, torch::Dtype dtype,
                       bool non_blocking) {
  const auto convert = [&](torch::Tensor& t) {
    if (!t.defined()) return;
    const auto target = t.is_floating_point() ? dtype : t.scalar_type();
    t.set_data(t.detach().to(device.value_or(t.device()), target, non_blocking));
  };
  for (const auto& m : module.modules(/*include_self=*/true)) {
    for (auto& p : m->named_parameters(/*recurse=*/false)) convert(p.value());
    for (auto& b : m->named_buffers(/*recurse=*/false)) convert(b.value());
  }
}

}  // namespace ptrain::models
