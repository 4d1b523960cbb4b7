#include "ptrain/train/grad_clip.h"

#include <algorithm>

#include "ptrain/core/error.h"

namespace ptrain::train {

torch::Tensor global_grad_norm(const std::vector<torch::Tensor>& grads) {
  check(!grads.empty(), "gradient clipping: no gradients");
  const bool all_float = std::all_of(grads.begin(), grads.end(),
                                     [](const torch::Tensor& g) { return g.scalar_type() == torch::kFloat; });
  if (all_float) return torch::stack(at::_foreach_norm(grads, 2)).norm(2);
  // Half gradients are upcast first: the norm of a large fp16 tensor overflows 65504 long before any
  // of its elements does.
  std::vector<torch::Tensor> norms;
  norms.reserve(grads.size());
  for (const auto& g : grads) norms.push_back(g.detach().to(torch::kFloat).norm(2));
  return torch::stack(norms).norm(2);
}

void clip_grads_to_norm_(const std::vector<torch::Tensor>& grads, const torch::Tensor& total_norm, double max_norm) {
  torch::NoGradGuard no_grad;
  auto coef = torch::clamp_max(max_norm / (total_norm + 1e-6), 1.0);
  for (const auto& g : grads) g.mul_(coef.to(g.device(), g.scalar_type()));
}

torch::Tensor clip_grad_norm_(const std::vector<torch::Tensor>& grads, double max_norm) {
  auto total = global_grad_norm(grads);
  clip_grads_to_norm_(grads, total, max_norm);
  return total;
}

}  // namespace ptrain::train
