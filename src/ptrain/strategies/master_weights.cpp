#include "ptrain/strategies/master_weights.h"

#include "ptrain/core/error.h"

namespace ptrain::strategies {

MasterWeights::MasterWeights(std::vector<torch::Tensor> model_params) : params_(std::move(model_params)) {
  torch::NoGradGuard no_grad;
  masters_.reserve(params_.size());
  for (const auto& p : params_) masters_.push_back(p.detach().to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true));
}

void MasterWeights::copy_grads_to_masters() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& g = params_[i].grad();
    check(g.defined(), "master weights: a parameter has no gradient");
    if (masters_[i].grad().defined()) {
      masters_[i].mutable_grad().copy_(g);
    } else {
      masters_[i].mutable_grad() = g.to(torch::kFloat);
    }
    params_[i].mutable_grad().reset();
  }
}

void MasterWeights::copy_masters_to_params() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(masters_[i]);
}

}  // namespace ptrain::strategies
