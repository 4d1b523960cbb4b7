#include "ptrain/train/model_probe.h"

#include <ATen/Context.h>

#include "ptrain/core/error.h"
#include "ptrain/precision/autocast_guard.h"

namespace ptrain::train {

namespace {

// LibTorch's message without the "<file>: " the TorchScript model puts before it, first line only.
std::string libtorch_message(const c10::Error& e, const std::string& name) {
  std::string text = e.what_without_backtrace();
  if (text.rfind(name + ": ", 0) == 0) text = text.substr(name.size() + 2);
  return text.substr(0, text.find('\n'));
}

std::string precision_text(const precision::PrecisionPolicy& policy, const torch::Device& device) {
  std::string text = "--precision " + policy.name;
  if (policy.autocast)
    text += " (autocast to " + std::string(c10::toString(policy.autocast_dtype)) + " on " + device.str() + ")";
  return text;
}

}  // namespace

void probe_as_trained(models::Model& model, const std::string& name, const torch::Tensor& batch,
                      const precision::PrecisionPolicy& policy, const torch::Device& device) {
  std::vector<torch::Tensor> buffers;
  {
    torch::NoGradGuard no_grad;
    for (const auto& buffer : model.buffers()) buffers.push_back(buffer.clone());
  }
  at::Generator generator = at::globalContext().defaultGenerator(device);
  const torch::Tensor random_state = generator.get_state();
  const bool was_training = model.is_training();
  const auto put_back = [&] {
    torch::NoGradGuard no_grad;
    size_t i = 0;
    for (auto& buffer : model.buffers()) buffer.copy_(buffers[i++]);
    generator.set_state(random_state);
    model.train(was_training);
  };

  for (const bool training : {true, false}) {
    try {
      model.train(training);
      const torch::AutoGradMode gradients(training);
      const precision::AutocastGuard autocast(device.type(), policy.autocast, policy.autocast_dtype);
      model.forward(batch);
    } catch (const c10::Error& e) {
      put_back();
      throw Error("--model " + name + ": forward fails in " +
                  (training ? std::string("train mode") : std::string("eval mode (no gradients), as evaluation runs it,")) +
                  " under " + precision_text(policy, device) + ": " + libtorch_message(e, name) +
                  "; nothing was trained");
    }
  }
  put_back();
}

}  // namespace ptrain::train
