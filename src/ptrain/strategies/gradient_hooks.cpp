#include "ptrain/strategies/gradient_hooks.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "ptrain/core/error.h"

namespace ptrain::strategies {
namespace {

class GradientReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  GradientReadyHook(std::function<void(size_t)> on_ready, size_t index) : on_ready_(std::move(on_ready)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    on_ready_(index_);
    return outputs;
  }

 private:
  std::function<void(size_t)> on_ready_;
  size_t index_;
};

}  // namespace

void GradientHooks::install(const std::vector<torch::Tensor>& params, const std::function<void(size_t)>& on_ready,
                            const std::function<std::string(size_t)>& name_of) {
  for (size_t i = 0; i < params.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(params[i]);
    check(accumulator != nullptr, name_of(i) + " is not a leaf that requires grad");
    keys_.push_back(accumulator->add_post_hook(std::make_unique<GradientReadyHook>(on_ready, i)));
    accumulators_.push_back(std::move(accumulator));
  }
}

void GradientHooks::remove() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(keys_[i]);
  accumulators_.clear();
  keys_.clear();
}

}  // namespace ptrain::strategies
