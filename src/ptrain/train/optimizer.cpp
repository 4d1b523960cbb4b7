#include "ptrain/train/optimizer.h"

#include <cmath>
#include <map>

#include "ptrain/core/error.h"

namespace ptrain::train {

namespace {

std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) {
    check(p.grad().defined(), "optimizer: a parameter has no gradient; was backward run on every micro-batch?");
    grads.push_back(p.grad());
  }
  return grads;
}

// Selects, per tensor, the old value where found_inf is 1: the step is skipped without a host read.
void keep_old_where_inf(const std::vector<torch::Tensor>& targets, const std::vector<torch::Tensor>& updated,
                        const torch::Tensor& found_inf) {
  auto skip = found_inf.to(torch::kBool);
  for (size_t i = 0; i < targets.size(); ++i) targets[i].copy_(torch::where(skip, targets[i], updated[i]));
}

std::map<std::string, torch::Tensor> index_state(const io::NamedTensors& state) {
  std::map<std::string, torch::Tensor> by_name;
  for (const auto& [name, tensor] : state) by_name[name] = tensor;
  return by_name;
}

torch::Tensor take_slot(std::map<std::string, torch::Tensor>& by_name, const std::string& key,
                        const torch::Tensor& like, const std::string& source) {
  auto it = by_name.find(key);
  check(it != by_name.end(), source + ": optimizer state '" + key + "' is missing");
  check(it->second.sizes() == like.sizes(),
        source + ": optimizer state '" + key + "' has shape " + c10::str(it->second.sizes()) + ", expected " +
            c10::str(like.sizes()));
  return it->second.to(like.options());
}

class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<torch::Tensor> params, std::vector<std::string> names, const config::OptimizerConfig& c)
      : Optimizer(std::move(params), std::move(names)), momentum_(c.momentum), nesterov_(c.nesterov),
        weight_decay_(c.weight_decay) {
    check(!nesterov_ || momentum_ > 0, "--nesterov needs --momentum > 0");
    if (momentum_ > 0) {
      for (const auto& p : params_) momentum_buffers_.push_back(torch::zeros_like(p));
    }
  }

  // torch.optim.SGD with dampening 0: d = g + wd*p; buf = m*buf + d (buf starts at d, as zeros give);
  // update = nesterov ? d + m*buf : buf; p -= lr*update.
  void step(double lr, const torch::Tensor* found_inf) override {
    torch::NoGradGuard no_grad;
    auto grads = grads_of(params_);
    std::vector<torch::Tensor> d = weight_decay_ > 0 ? at::_foreach_add(grads, params_, weight_decay_) : grads;
    if (found_inf == nullptr) {
      if (momentum_ > 0) {
        at::_foreach_mul_(momentum_buffers_, momentum_);
        at::_foreach_add_(momentum_buffers_, d);
        d = nesterov_ ? at::_foreach_add(d, momentum_buffers_, momentum_) : momentum_buffers_;
      }
      at::_foreach_add_(params_, d, -lr);
      return;
    }
    if (momentum_ > 0) {
      auto buffers = at::_foreach_add(at::_foreach_mul(momentum_buffers_, momentum_), d);
      keep_old_where_inf(momentum_buffers_, buffers, *found_inf);
      d = nesterov_ ? at::_foreach_add(d, momentum_buffers_, momentum_) : momentum_buffers_;
    }
    keep_old_where_inf(params_, at::_foreach_add(params_, d, -lr), *found_inf);
  }

  io::NamedTensors state() const override {
    io::NamedTensors out;
    for (size_t i = 0; i < momentum_buffers_.size(); ++i)
      out.emplace_back(names_[i] + ".momentum_buffer", momentum_buffers_[i]);
    return out;
  }

  void load_state(const io::NamedTensors& state, const std::string& source) override {
    auto by_name = index_state(state);
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < momentum_buffers_.size(); ++i)
      momentum_buffers_[i].copy_(take_slot(by_name, names_[i] + ".momentum_buffer", momentum_buffers_[i], source));
  }

 private:
  double momentum_;
  bool nesterov_;
  double weight_decay_;
  std::vector<torch::Tensor> momentum_buffers_;
};

class AdamW final : public Optimizer {
 public:
  AdamW(std::vector<torch::Tensor> params, std::vector<std::string> names, const config::OptimizerConfig& c)
      : Optimizer(std::move(params), std::move(names)), beta1_(c.beta1), beta2_(c.beta2), eps_(c.eps),
        weight_decay_(c.weight_decay) {
    check(!params_.empty(), "optimizer: no parameters");
    for (const auto& p : params_) {
      exp_avg_.push_back(torch::zeros_like(p));
      exp_avg_sq_.push_back(torch::zeros_like(p));
    }
    // The step count lives on the device so that a skipped step does not advance it without a host read.
    step_ = torch::zeros({}, params_.front().options().dtype(torch::kFloat));
  }

  // torch.optim.AdamW: p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  // p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps).
  void step(double lr, const torch::Tensor* found_inf) override {
    torch::NoGradGuard no_grad;
    auto grads = grads_of(params_);
    if (found_inf != nullptr) {
      step_.add_(1 - *found_inf);
    } else {
      step_.add_(1);
    }
    auto t = step_.to(torch::kDouble);
    auto bias1 = 1 - torch::pow(beta1_, t);
    auto bias2_sqrt = torch::sqrt(1 - torch::pow(beta2_, t));

    auto m = at::_foreach_add(at::_foreach_mul(exp_avg_, beta1_), grads, 1 - beta1_);
    auto v = at::_foreach_addcmul(at::_foreach_mul(exp_avg_sq_, beta2_), grads, grads, 1 - beta2_);
    auto step_size = lr / bias1;
    const double decay = 1 - lr * weight_decay_;
    std::vector<torch::Tensor> p_new;
    p_new.reserve(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) {
      auto denom = (v[i].sqrt() / bias2_sqrt).add_(eps_);
      p_new.push_back(params_[i] * decay - m[i] / denom * step_size);
    }
    if (found_inf == nullptr) {
      for (size_t i = 0; i < params_.size(); ++i) {
        exp_avg_[i].copy_(m[i]);
        exp_avg_sq_[i].copy_(v[i]);
        params_[i].copy_(p_new[i]);
      }
      return;
    }
    keep_old_where_inf(exp_avg_, m, *found_inf);
    keep_old_where_inf(exp_avg_sq_, v, *found_inf);
    keep_old_where_inf(params_, p_new, *found_inf);
  }

  io::NamedTensors state() const override {
    io::NamedTensors out;
    out.emplace_back("step", step_);
    for (size_t i = 0; i < params_.size(); ++i) {
      out.emplace_back(names_[i] + ".exp_avg", exp_avg_[i]);
      out.emplace_back(names_[i] + ".exp_avg_sq", exp_avg_sq_[i]);
    }
    return out;
  }

  void load_state(const io::NamedTensors& state, const std::string& source) override {
    auto by_name = index_state(state);
    torch::NoGradGuard no_grad;
    step_.copy_(take_slot(by_name, "step", step_, source));
    for (size_t i = 0; i < params_.size(); ++i) {
      exp_avg_[i].copy_(take_slot(by_name, names_[i] + ".exp_avg", exp_avg_[i], source));
      exp_avg_sq_[i].copy_(take_slot(by_name, names_[i] + ".exp_avg_sq", exp_avg_sq_[i], source));
    }
  }

 private:
  double beta1_, beta2_, eps_, weight_decay_;
  std::vector<torch::Tensor> exp_avg_, exp_avg_sq_;
  torch::Tensor step_;
};

}  // namespace

Optimizer::Optimizer(std::vector<torch::Tensor> params, std::vector<std::string> names)
    : params_(std::move(params)), names_(std::move(names)) {
  check(params_.size() == names_.size(), "optimizer: one name per parameter is needed");
}

void Optimizer::zero_grad() {
  for (auto& p : params_) p.mutable_grad().reset();
}

std::unique_ptr<Optimizer> make_optimizer(const config::OptimizerConfig& config, std::vector<torch::Tensor> params,
                                          std::vector<std::string> names) {
  if (config.name == "sgd") return std::make_unique<Sgd>(std::move(params), std::move(names), config);
  if (config.name == "adamw") return std::make_unique<AdamW>(std::move(params), std::move(names), config);
  throw Error("--optimizer: unknown optimizer '" + config.name + "' (known: sgd, adamw)");
}

}  // namespace ptrain::train
