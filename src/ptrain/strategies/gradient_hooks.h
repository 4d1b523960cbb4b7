// The signal the data-parallel strategies reduce on during backward: a hook on each parameter's
// gradient accumulator that runs once autograd has accumulated that parameter's gradient (DDP fills
// its buckets on it, the ZeRO stages and FSDP complete their groups).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace ptrain::strategies {

class GradientHooks {
 public:
  GradientHooks() = default;
  GradientHooks(const GradientHooks&) = delete;
  GradientHooks& operator=(const GradientHooks&) = delete;
  ~GradientHooks() { remove(); }

  // on_ready(i) runs after params[i]'s gradient is accumulated. A parameter that is not a leaf requiring
  // grad is refused, named by name_of(i).
  void install(const std::vector<torch::Tensor>& params, const std::function<void(size_t)>& on_ready,
               const std::function<std::string(size_t)>& name_of);
  // Takes the hooks off again; idempotent.
  void remove();

 private:
  // AccumulateGrad nodes are owned weakly by their parameters; holding them keeps the hooks in place.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> keys_;
};

}  // namespace ptrain::strategies
