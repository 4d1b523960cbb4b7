#include "ptrain/models/model.h"

#include <algorithm>

#include "ptrain/core/error.h"
#include "ptrain/core/text.h"

namespace ptrain::models {

std::shared_ptr<Model> Model::make_replica() const {
  throw Error("model '" + name() + "' cannot make replicas of itself, which --strategy dp needs");
}

const std::vector<std::string>& fusion_names() {
  static const std::vector<std::string> names = {"weight-casts", "shortcut-norms", "stem-pool", "residual-twins"};
  return names;
}

FusionChoices fusions_skipping(const std::vector<std::string>& names) {
  FusionChoices choices;
  bool* const flags[] = {&choices.weight_casts, &choices.shortcut_norms, &choices.stem_pool, &choices.residual_twins};
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
