#include "ptrain/api/fit.h"

#include "ptrain/core/error.h"
#include "ptrain/train/plan.h"

namespace ptrain {

namespace {

data::Dataset as_dataset(const torch::Tensor& inputs, const torch::Tensor& labels, const std::vector<std::string>& classes,
                         const char* split) {
  const std::string where = std::string("ptrain::tensor_data: the ") + split + " split";
  check(inputs.defined() && labels.defined(), where + " needs inputs and labels");
  check(labels.scalar_type() == torch::kInt64 && labels.dim() >= 1 && labels.size(0) == inputs.size(0),
        where + ": labels must be int64 with one entry per sample");
  data::Dataset ds;
  ds.images = inputs.cpu().contiguous();
  ds.labels = labels.cpu().contiguous();
  if (inputs.scalar_type() == torch::kInt64) {
    check(inputs.dim() == 2 && labels.sizes() == inputs.sizes(), where + ": tokens must be N x T with labels N x T");
    ds.vocab_size = std::max(inputs.max().item<int64_t>(), labels.max().item<int64_t>()) + 1;
    ds.description = std::string("in-memory tokens (") + split + ")";
    return ds;
  }
  check(inputs.scalar_type() == torch::kUInt8 && inputs.dim() == 4,
        where + ": images must be uint8 N x C x H x W (or int64 N x T tokens)");
  ds.classes = classes;
  if (ds.classes.empty()) {
    const int64_t count = labels.max().item<int64_t>() + 1;
    for (int64_t c = 0; c < count; ++c) ds.classes.push_back(std::to_string(c));
  }
  ds.description = std::string("in-memory images (") + split + ", " + std::to_string(inputs.size(0)) + ")";
  return ds;
}

}  // namespace

Data tensor_data(torch::Tensor train_inputs, torch::Tensor train_labels, torch::Tensor test_inputs,
                 torch::Tensor test_labels, std::vector<std::string> classes) {
  auto train_set = std::make_shared<data::Dataset>(as_dataset(train_inputs, train_labels, classes, "training"));
  auto test_set = std::make_shared<data::Dataset>(as_dataset(test_inputs, test_labels, classes, "test"));
  if (test_set->is_tokens()) test_set->vocab_size = train_set->vocab_size = std::max(train_set->vocab_size, test_set->vocab_size);
  test_set->classes = train_set->classes;
  return {[train_set, test_set](bool train) { return train ? *train_set : *test_set; }};
}

RunRecord fit(std::shared_ptr<models::Model> model, const Data& data, TrainConfig config, const TrainHooks& hooks) {
  check(model != nullptr, "ptrain::fit: no model");
  config.model.name = model->name();
  // Data of the caller's own is none of the registry's sets: it gets the generic normalisation (0.5, 0.5).
  if (data.open) config.data.dataset = "in-memory";
  train::Plan plan = train::make_plan(config, /*model_from_caller=*/true);
  plan.make_model = [model](const models::ModelSpec&) { return model; };
  plan.open_data = data.open;
  return train::train(plan, "ptrain::fit(" + model->name() + ")", hooks);
}

}  // namespace ptrain
