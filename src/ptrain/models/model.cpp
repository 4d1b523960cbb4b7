#include "ptrain/models/model.h"

#include "ptrain/core/error.h"

namespace ptrain::models {

std::shared_ptr<Model> Model::make_replica() const {
  throw Error("model '" + name() + "' cannot make replicas of itself, which --strategy dp needs");
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
