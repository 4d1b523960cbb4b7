#include "ptrain/models/activation_checkpoint.h"

#include "ptrain/core/torch_compat.h"

namespace ptrain::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct AutocastState {
  bool cpu_enabled;
  c10::ScalarType cpu_dtype;
  bool cuda_enabled;
  c10::ScalarType cuda_dtype;

  static AutocastState current() {
    return {compat::autocast_enabled(c10::DeviceType::CPU), compat::autocast_dtype(c10::DeviceType::CPU),
            compat::autocast_enabled(c10::DeviceType::CUDA), compat::autocast_dtype(c10::DeviceType::CUDA)};
  }

  void apply() const {
    compat::set_autocast_enabled(c10::DeviceType::CPU, cpu_enabled);
    compat::set_autocast_dtype(c10::DeviceType::CPU, cpu_dtype);
    compat::set_autocast_enabled(c10::DeviceType::CUDA, cuda_enabled);
    compat::set_autocast_dtype(c10::DeviceType::CUDA, cuda_dtype);
  }
};

// Puts the given autocast state in place for a scope (backward runs where autocast is typically off, or on
// an autograd worker thread whose thread-local autocast state is unset) with the weight-cast cache off:
// casts cached while grad was disabled carry no autograd history, and reusing one would cut the
// parameters out of the recomputed graph.
class AutocastScope {
 public:
  explicit AutocastScope(const AutocastState& wanted)
      : saved_(AutocastState::current()), saved_cache_(compat::autocast_cache_enabled()) {
    wanted.apply();
    compat::set_autocast_cache_enabled(false);
  }
  ~AutocastScope() {
    saved_.apply();
    compat::set_autocast_cache_enabled(saved_cache_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  AutocastState saved_;
  bool saved_cache_;
};

// Buffers as they were before the recomputation, put back when the scope ends: a second train-mode
// BatchNorm forward would otherwise count the batch twice in running_mean, running_var and
// num_batches_tracked. The scope must cover the recomputed graph's backward too, since BatchNorm's
// backward checks that the running statistics it saved were not modified in place.
class BufferSnapshot {
 public:
  explicit BufferSnapshot(torch::nn::Module& owner) {
    torch::NoGradGuard no_grad;
    for (auto& buffer : owner.buffers()) {
      if (buffer.defined()) saved_.emplace_back(buffer, buffer.clone());
    }
  }
  ~BufferSnapshot() {
    torch::NoGradGuard no_grad;
    for (auto& [live, copy] : saved_) live.copy_(copy);
  }
  BufferSnapshot(const BufferSnapshot&) = delete;
  BufferSnapshot& operator=(const BufferSnapshot&) = delete;

 private:
  std::vector<std::pair<torch::Tensor, torch::Tensor>> saved_;
};

// What backward needs besides the saved input; IValue capsules are the way to keep C++ objects in a
// custom Function's context.
struct Recompute : torch::CustomClassHolder {
  std::function<torch::Tensor(const torch::Tensor&)> fn;
  torch::nn::Module* owner = nullptr;
  std::vector<torch::Tensor> params;  // owner's parameters that require grad, in the order given to forward
  AutocastState autocast{};
  bool input_requires_grad = false;
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // params are inputs only so that autograd gives them edges: the gradients come from the recomputed graph.
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<Recompute> state, torch::Tensor input,
                               at::TensorList /*params*/) {
    torch::NoGradGuard no_grad;
    state->autocast = AutocastState::current();
    state->input_requires_grad = input.requires_grad();
    torch::Tensor output;
    {
      const bool cache = compat::autocast_cache_enabled();
      compat::set_autocast_cache_enabled(false);  // see AutocastScope
      try {
        output = state->fn(input);
      } catch (...) {
        compat::set_autocast_cache_enabled(cache);
        throw;
      }
      compat::set_autocast_cache_enabled(cache);
    }
    ctx->save_for_backward({input});
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return {output};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto state = c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["state"].toCapsule());
    const auto input = ctx->get_saved_variables()[0];
    const auto& params = state->params;

    auto detached = input.detach().requires_grad_(true);
    std::vector<torch::Tensor> wrt{detached};
    wrt.insert(wrt.end(), params.begin(), params.end());
    variable_list grads;
    {
      BufferSnapshot buffers(*state->owner);
      torch::Tensor output;
      {
        AutocastScope autocast(state->autocast);
        torch::AutoGradMode grad(true);
        output = state->fn(detached);
      }
      torch::Tensor grad_output = grad_outputs[0];
      if (!grad_output.defined()) grad_output = torch::zeros_like(output);
      grads = torch::autograd::grad({output}, wrt, {grad_output}, /*retain_graph=*/false,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    }
    // One gradient per forward argument: none for the state, then the input, then each parameter.
    variable_list result{torch::Tensor(), state->input_requires_grad ? grads[0] : torch::Tensor()};
    result.insert(result.end(), grads.begin() + 1, grads.end());
    return result;
  }
};

}  // namespace

torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& fn, const torch::Tensor& input,
                         torch::nn::Module& owner) {
  auto state = c10::make_intrusive<Recompute>();
  state->fn = fn;
  state->owner = &owner;
  for (auto& p : owner.parameters()) {
    if (p.requires_grad()) state->params.push_back(p);
  }
  return CheckpointFunction::apply(state, input, at::TensorList(state->params))[0];
}

}  // namespace ptrain::models
