#include "ptrain/kernels/cross_entropy.h"

#include <torch/csrc/autograd/custom_function.h>

#include "ptrain/kernels/fused.h"

namespace ptrain::kernels {

namespace {

// The fused forward keeps each row's log-sum-exp for the backward, which reads the logits again rather
// than keeping probabilities: one float a row instead of a tensor the logits' size.
class FusedCrossEntropy : public torch::autograd::Function<FusedCrossEntropy> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                                                const torch::Tensor& labels, bool mean, int64_t classes) {
    const auto rows = fused::cross_entropy_forward(logits, labels, classes);
    const double divisor = mean ? static_cast<double>(std::max<int64_t>(1, logits.size(0))) : 1.0;
    auto loss = rows.loss.sum() / divisor;
    auto correct = rows.correct.sum();
    ctx->save_for_backward({logits, labels, rows.lse});
    ctx->saved_data["divisor"] = divisor;
    ctx->saved_data["classes"] = classes;
    ctx->mark_non_differentiable({correct});
    return {loss, correct};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const double divisor = ctx->saved_data["divisor"].toDouble();
    const auto scale = grad_outputs[0].to(torch::kFloat) / divisor;
    auto grad = fused::cross_entropy_backward(saved[0], saved[1], saved[2], scale, ctx->saved_data["classes"].toInt());
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool fused_kernels_available(const torch::Device& device) { return fused::available(device); }

bool fused_cross_entropy_applies(const torch::Tensor& logits) {
  const auto dtype = logits.scalar_type();
  return fused::available(logits.device()) && logits.dim() == 2 && logits.stride(1) == 1 &&
         (dtype == torch::kFloat || dtype == torch::kHalf || dtype == torch::kBFloat16);
}

LossAndCorrect reference_cross_entropy(const torch::Tensor& logits_in, const torch::Tensor& labels, Reduction reduction,
                                       int64_t classes) {
  namespace F = torch::nn::functional;
  const auto logits = classes > 0 && classes < logits_in.size(1) ? logits_in.narrow(1, 0, classes) : logits_in;
  auto options = F::CrossEntropyFuncOptions();  // reduction: mean
  if (reduction == Reduction::kSum) options.reduction(torch::kSum);
  auto loss = F::cross_entropy(logits.to(torch::kFloat), labels, options);
  torch::Tensor correct;
  {
    torch::NoGradGuard no_grad;
    correct = logits.argmax(1).eq(labels).sum().to(torch::kFloat);
  }
  return {loss, correct};
}

LossAndCorrect cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels, Reduction reduction,
                             bool allow_fused, int64_t classes) {
  if (classes <= 0) classes = logits.size(1);
  if (!allow_fused || !fused_cross_entropy_applies(logits))
    return reference_cross_entropy(logits, labels, reduction, classes);
  auto out = FusedCrossEntropy::apply(logits, labels, reduction == Reduction::kMean, classes);
  return {out[0], out[1]};
}

}  // namespace ptrain::kernels
