// The casts autocast makes of the float weights of convolutions and linear layers, made for a group of parameters
// at once. Autocast casts each weight as its layer runs, and autograd casts each gradient back: a kernel a
// parameter each way (ResNet-50 in amp-bf16: 55 of them forward and as many backward, most on tensors too small
// to fill the GPU). Grouped, the forward is one kernel into one buffer and the backward one kernel out of one,
// with the same rounding, so the layers compute what they computed before, bit for bit.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace ptrain::kernels {

// params (one device, one float dtype, each non-overlapping and dense) cast to dtype, each with its parameter's
// sizes and strides, all in one buffer; each cast's gradient reaches its parameter cast back to the parameter's
// dtype, in its strides. allow_fused: one CUDA kernel each way where the build has it (cuda/parameter_cast.cu),
// else a copy a parameter.
std::vector<torch::Tensor> cast_parameters(const std::vector<torch::Tensor>& params, c10::ScalarType dtype,
                                           bool allow_fused);

// While alive, on this thread: the autocast casts of params for activations on device, grouped by cast_parameters,
// for the layers that run in it to take (cast_of). Empty where autocast would cast none of them: autocast off for
// device's type, its dtype a float one, or no parameter a float tensor on device. A parameter that requires no
// gradient while gradients are recorded is left to autocast's own cast. Scopes nest; the innermost that holds a
// parameter answers for it.
class ParameterCastScope {
 public:
  ParameterCastScope(const std::vector<torch::Tensor>& params, const torch::Device& device, bool allow_fused);
  ~ParameterCastScope();
  ParameterCastScope(const ParameterCastScope&) = delete;
  ParameterCastScope& operator=(const ParameterCastScope&) = delete;

  // param as the live scopes cast it, or param itself when none holds it.
  static torch::Tensor cast_of(const torch::Tensor& param);
  // How many parameters this scope cast.
  size_t size() const { return casts_.size(); }

 private:
  std::vector<std::pair<const c10::TensorImpl*, torch::Tensor>> casts_;
  ParameterCastScope* outer_;
};

// The weights and biases (where defined) of the layers in unit, itself included, whose type is one of Layers: what
// a model hands a ParameterCastScope for a unit (ResNet: Conv2d and Linear; GPT: its Linear).
template <typename... Layers>
std::vector<torch::Tensor> layer_parameters(torch::nn::Module& unit) {
  std::vector<torch::Tensor> params;
  const auto add = [&](const auto* layer) {
    if (layer == nullptr) return;
    if (layer->weight.defined()) params.push_back(layer->weight);
    if (layer->bias.defined()) params.push_back(layer->bias);
  };
  for (const auto& module : unit.modules(/*include_self=*/true)) (add(module->template as<Layers>()), ...);
  return params;
}

// conv(x) and linear(x) with their parameters as the live scopes cast them (their own forward where no scope holds
// them, or where the convolution pads other than with explicit zeros).
torch::Tensor forward_with_casts(torch::nn::Conv2dImpl& conv, const torch::Tensor& x);
torch::Tensor forward_with_casts(torch::nn::LinearImpl& linear, const torch::Tensor& x);

}  // namespace ptrain::kernels
