// CPU builds: no fused kernels; the public functions always take the LibTorch reference path.
#include "ptrain/core/error.h"
#include "ptrain/kernels/fused.h"

namespace ptrain::kernels::fused {

namespace {
[[noreturn]] void unavailable(const char* what) {
  throw Error(std::string(what) + ": this ptrain was built without CUDA kernels");
}
}  // namespace

bool available(const torch::Device&) { return false; }

CrossEntropyRows cross_entropy_forward(const torch::Tensor&, const torch::Tensor&, int64_t) {
  unavailable("fused cross_entropy_forward");
}

torch::Tensor cross_entropy_backward(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                     const torch::Tensor&, int64_t) {
  unavailable("fused cross_entropy_backward");
}

BatchNormReluForward batch_norm_relu_forward(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                             const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, double,
                                             double, bool, BatchNormPasses) {
  unavailable("fused batch_norm_relu");
}

BatchNormStatsFromSums batch_norm_stats_from_sums(const torch::Tensor&, const torch::Tensor&, int64_t,
                                                  const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                                  const torch::Tensor&, double, double, c10::ScalarType) {
  unavailable("fused batch_norm statistics from sums");
}

torch::Tensor batch_norm_relu_apply(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, bool) {
  unavailable("fused batch_norm_relu apply");
}

BatchNormReluBackward batch_norm_relu_backward(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                               const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                               const torch::Tensor&,
                                               const torch::Tensor&, bool, bool, BatchNormPasses) {
  unavailable("fused batch_norm_relu backward");
}

DualBatchNormReluForward batch_norm_add_batch_norm_relu_forward(const torch::Tensor&, const BatchNormParams&,
                                                                const torch::Tensor&, const BatchNormParams&) {
  unavailable("fused batch_norm_add_batch_norm_relu");
}

DualBatchNormReluBackward batch_norm_add_batch_norm_relu_backward(const torch::Tensor&, const torch::Tensor&,
                                                                  const torch::Tensor&, const torch::Tensor&,
                                                                  const torch::Tensor&, const BatchNormStats&,
                                                                  const BatchNormStats&, const torch::Tensor&,
                                                                  const torch::Tensor&) {
  unavailable("fused batch_norm_add_batch_norm_relu backward");
}

BatchNormReluMaxPoolForward batch_norm_relu_max_pool_forward(const torch::Tensor&, const BatchNormParams&, int64_t,
                                                             int64_t, int64_t) {
  unavailable("fused batch_norm_relu_max_pool");
}

BatchNormReluMaxPoolBackward batch_norm_relu_max_pool_backward(const torch::Tensor&, const torch::Tensor&,
                                                               const torch::Tensor&, const BatchNormStats&,
                                                               const torch::Tensor&, int64_t, int64_t, int64_t) {
  unavailable("fused batch_norm_relu_max_pool backward");
}

torch::Tensor space_to_depth(const torch::Tensor&, int64_t, int64_t, int64_t, c10::ScalarType) {
  unavailable("fused space_to_depth");
}

MaxPoolForward max_pool_forward(const torch::Tensor&, int64_t, int64_t, int64_t) {
  unavailable("fused max_pool2d");
}

torch::Tensor max_pool_backward(const torch::Tensor&, const torch::Tensor&, at::IntArrayRef, int64_t, int64_t,
                                int64_t) {
  unavailable("fused max_pool2d backward");
}

void cast_tensors(const std::vector<torch::Tensor>&, const std::vector<torch::Tensor>&) {
  unavailable("fused cast_tensors");
}

AddLayerNormForward add_layer_norm_forward(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                           const torch::Tensor&, double, c10::ScalarType, bool) {
  unavailable("fused add_layer_norm");
}

AddLayerNormBackward add_layer_norm_backward(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                             const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                             c10::ScalarType, bool) {
  unavailable("fused add_layer_norm backward");
}

torch::Tensor bias_gradient(const torch::Tensor&, c10::ScalarType) { unavailable("fused bias_gradient"); }

GeluBiasGradient gelu_backward_bias_gradient(const torch::Tensor&, const torch::Tensor&, c10::ScalarType) {
  unavailable("fused gelu_backward_bias_gradient");
}

GeluForward gelu_tanh_forward(const torch::Tensor&, bool) { unavailable("fused gelu_tanh_forward"); }

GeluBackward gelu_tanh_backward(const torch::Tensor&, const torch::Tensor&, bool) {
  unavailable("fused gelu_tanh_backward");
}

torch::Tensor fp8_amax_stats(const torch::Device&) { unavailable("fused fp8 amax"); }

Fp8Cast fp8_cast(const torch::Tensor&, bool, Fp8CastExtras) { unavailable("fused fp8 cast"); }

bool conv_stats_supported(const torch::Tensor&, const torch::Tensor&, int64_t, int64_t, bool, std::string* why_not,
                          bool) {
  if (why_not) *why_not = "this ptrain was built without CUDA kernels";
  return false;
}

ConvStats conv_stats(const torch::Tensor&, const torch::Tensor&, int64_t, int64_t, const torch::Tensor&,
                     const torch::Tensor&) {
  unavailable("fused conv_stats");
}

}  // namespace ptrain::kernels::fused
