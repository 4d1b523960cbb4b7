#include "ptrain/train/optimizer.h"

#include <cmath>
#include <map>

#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"

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

// The updates are computed out of place, so that a skipped step can keep the old values without a host
// read; done over all parameters at once, their temporaries took three times the parameters (AdamW: new
// moments, new parameters), tens of GiB beside a ZeRO shard of billions of elements. The optimizers
// work instead in batches of at most batch_elements elements, cutting larger tensors into slices:
// temporaries stay a few batches large, and every element gets the same update as before.
struct Slice {
  size_t index;                 // which parameter
  int64_t offset = 0, length = 0;
  bool whole = true;            // the tensor itself (small, or not viewable as flat)
};

std::vector<std::vector<Slice>> batches_of(const std::vector<torch::Tensor>& params, int64_t batch_elements) {
  std::vector<std::vector<Slice>> batches(1);
  int64_t in_batch = 0;
  const auto add = [&](const Slice& slice, int64_t elements) {
    if (in_batch > 0 && in_batch + elements > batch_elements) {
      batches.emplace_back();
      in_batch = 0;
    }
    batches.back().push_back(slice);
    in_batch += elements;
  };
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].numel();
    if (n <= batch_elements || !params[i].is_contiguous()) {
      add({i}, n);
      continue;
    }
    for (int64_t offset = 0; offset < n; offset += batch_elements) {
      add({i, offset, std::min(batch_elements, n - offset), false}, std::min(batch_elements, n - offset));
    }
  }
  return batches;
}

// The part of tensor t (laid out as parameter slice.index) that slice covers: a view, so writes reach t.
torch::Tensor slice_of(const torch::Tensor& t, const Slice& slice) {
  if (slice.whole) return t;
  check(t.is_contiguous(), "optimizer: a gradient or state tensor is not contiguous like its parameter");
  return t.view({-1}).narrow(0, slice.offset, slice.length);
}

std::vector<torch::Tensor> slices_of(const std::vector<torch::Tensor>& tensors, const std::vector<Slice>& batch) {
  std::vector<torch::Tensor> out;
  out.reserve(batch.size());
  for (const auto& slice : batch) out.push_back(slice_of(tensors[slice.index], slice));
  return out;
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

// The fused kernels need every tensor on one CUDA device in one floating dtype; LibTorch 2.4+ has them.
bool fused_kernels_apply(const std::vector<torch::Tensor>& params) {
  if (!compat::has_fused_optimizers() || params.empty()) return false;
  const auto& first = params.front();
  if (!first.is_cuda()) return false;
  for (const auto& p : params) {
    if (p.device() != first.device() || p.scalar_type() != first.scalar_type() || !p.is_floating_point()) return false;
  }
  return true;
}

torch::Tensor undefined_or(const torch::Tensor* t) { return t != nullptr ? *t : torch::Tensor(); }

// What SGD and AdamW share: the update in batches of at most batch_elements (the foreach path), or one fused
// kernel reading the learning rate from a device tensor, which set_learning_rate fills before each (replayed) step.
class BatchedOrFusedOptimizer : public Optimizer {
 public:
  void set_learning_rate(double lr) override {
    lr_ = lr;
    if (fused_) lr_tensor_.fill_(lr);
  }
  bool capturable() const override { return fused_; }
  std::string implementation() const override { return fused_ ? "fused" : "foreach"; }

 protected:
  BatchedOrFusedOptimizer(std::vector<torch::Tensor> params, std::vector<std::string> names, int64_t batch_elements,
                          bool allow_fused)
      : Optimizer(std::move(params), std::move(names)), batches_(batches_of(params_, batch_elements)),
        fused_(allow_fused && fused_kernels_apply(params_)) {
    if (fused_) lr_tensor_ = torch::zeros({}, params_.front().options().dtype(torch::kFloat));
  }

  std::vector<std::vector<Slice>> batches_;
  bool fused_;
  double lr_ = 0;
  torch::Tensor lr_tensor_;  // fused: the rate the kernel reads
};

class Sgd final : public BatchedOrFusedOptimizer {
 public:
  Sgd(std::vector<torch::Tensor> params, std::vector<std::string> names, const OptimizerOptions& c,
      int64_t batch_elements, bool allow_fused)
      : BatchedOrFusedOptimizer(std::move(params), std::move(names), batch_elements, allow_fused),
        momentum_(c.momentum), nesterov_(c.nesterov), weight_decay_(c.weight_decay) {
    check(!nesterov_ || momentum_ > 0, "--nesterov needs --momentum > 0");
    if (momentum_ > 0) {
      for (const auto& p : params_) momentum_buffers_.push_back(torch::zeros_like(p));
    }
  }

  // torch.optim.SGD with dampening 0: d = g + wd*p; buf = m*buf + d (buf starts at d, as zeros give);
  // update = nesterov ? d + m*buf : buf; p -= lr*update.
  void step_at_set_rate(const torch::Tensor* found_inf) override {
    torch::NoGradGuard no_grad;
    const auto all_grads = grads_of(params_);
    if (fused_) {
      // In place, so no batches are needed to bound temporaries.
      compat::fused_sgd_step(params_, all_grads, momentum_buffers_, weight_decay_, momentum_, lr_tensor_, nesterov_,
                             undefined_or(found_inf));
      return;
    }
    const double lr = lr_;
    for (const auto& batch : batches_) {
      const auto params = slices_of(params_, batch);
      const auto grads = slices_of(all_grads, batch);
      const auto buffers = momentum_ > 0 ? slices_of(momentum_buffers_, batch) : std::vector<torch::Tensor>{};
      std::vector<torch::Tensor> d = weight_decay_ > 0 ? at::_foreach_add(grads, params, weight_decay_) : grads;
      if (found_inf == nullptr) {
        if (momentum_ > 0) {
          at::_foreach_mul_(buffers, momentum_);
          at::_foreach_add_(buffers, d);
          d = nesterov_ ? at::_foreach_add(d, buffers, momentum_) : buffers;
        }
        at::_foreach_add_(params, d, -lr);
        continue;
      }
      if (momentum_ > 0) {
        auto updated = at::_foreach_add(at::_foreach_mul(buffers, momentum_), d);
        keep_old_where_inf(buffers, updated, *found_inf);
        d = nesterov_ ? at::_foreach_add(d, buffers, momentum_) : buffers;
      }
      keep_old_where_inf(params, at::_foreach_add(params, d, -lr), *found_inf);
    }
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

class AdamW final : public BatchedOrFusedOptimizer {
 public:
  AdamW(std::vector<torch::Tensor> params, std::vector<std::string> names, const OptimizerOptions& c,
        int64_t batch_elements, bool allow_fused)
      : BatchedOrFusedOptimizer(std::move(params), std::move(names), batch_elements, allow_fused), beta1_(c.beta1),
        beta2_(c.beta2), eps_(c.eps), weight_decay_(c.weight_decay) {
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
  void step_at_set_rate(const torch::Tensor* found_inf) override {
    torch::NoGradGuard no_grad;
    const auto all_grads = grads_of(params_);
    if (found_inf != nullptr) {
      step_.add_(1 - *found_inf);
    } else {
      step_.add_(1);
    }
    if (fused_) {
      // The kernel reads one step count a tensor; every tensor shares this optimizer's one count.
      const std::vector<torch::Tensor> steps(params_.size(), step_);
      compat::fused_adamw_step(params_, all_grads, exp_avg_, exp_avg_sq_, steps, lr_tensor_, beta1_, beta2_,
                               weight_decay_, eps_, undefined_or(found_inf));
      return;
    }
    const double lr = lr_;
    auto t = step_.to(torch::kDouble);
    auto bias1 = 1 - torch::pow(beta1_, t);
    auto bias2_sqrt = torch::sqrt(1 - torch::pow(beta2_, t));

    auto step_size = lr / bias1;
    const double decay = 1 - lr * weight_decay_;
    for (const auto& batch : batches_) {
      const auto params = slices_of(params_, batch);
      const auto grads = slices_of(all_grads, batch);
      const auto exp_avg = slices_of(exp_avg_, batch);
      const auto exp_avg_sq = slices_of(exp_avg_sq_, batch);
      auto m = at::_foreach_add(at::_foreach_mul(exp_avg, beta1_), grads, 1 - beta1_);
      auto v = at::_foreach_addcmul(at::_foreach_mul(exp_avg_sq, beta2_), grads, grads, 1 - beta2_);
      std::vector<torch::Tensor> p_new;
      p_new.reserve(params.size());
      for (size_t i = 0; i < params.size(); ++i) {
        auto denom = (v[i].sqrt() / bias2_sqrt).add_(eps_);
        p_new.push_back(params[i] * decay - m[i] / denom * step_size);
      }
      if (found_inf == nullptr) {
        for (size_t i = 0; i < params.size(); ++i) {
          exp_avg[i].copy_(m[i]);
          exp_avg_sq[i].copy_(v[i]);
          params[i].copy_(p_new[i]);
        }
        continue;
      }
      keep_old_where_inf(exp_avg, m, *found_inf);
      keep_old_where_inf(exp_avg_sq, v, *found_inf);
      keep_old_where_inf(params, p_new, *found_inf);
    }
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

std::string optimizer_name(OptimizerKind kind) { return kind == OptimizerKind::adamw ? "adamw" : "sgd"; }

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options, std::vector<torch::Tensor> params,
                                          std::vector<std::string> names, int64_t batch_elements, bool allow_fused) {
  check(batch_elements > 0, "optimizer: batch_elements must be positive");
  if (options.kind == OptimizerKind::adamw)
    return std::make_unique<AdamW>(std::move(params), std::move(names), options, batch_elements, allow_fused);
  return std::make_unique<Sgd>(std::move(params), std::move(names), options, batch_elements, allow_fused);
}

}  // namespace ptrain::train
