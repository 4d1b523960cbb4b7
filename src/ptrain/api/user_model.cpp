#include "ptrain/api/user_model.h"

#include "ptrain/core/error.h"
#include "ptrain/models/activation_checkpoint.h"

namespace ptrain {

namespace {

// Registers source's own parameters, buffers and children on target under their names: both then hold
// the same tensors and submodules.
void share_registrations(torch::nn::Module& source, torch::nn::Module& target) {
  for (auto& p : source.named_parameters(/*recurse=*/false)) target.register_parameter(p.key(), p.value(), p.value().requires_grad());
  for (auto& b : source.named_buffers(/*recurse=*/false)) target.register_buffer(b.key(), b.value());
  for (auto& c : source.named_children()) target.register_module(c.key(), c.value());
}

}  // namespace

void ShardedUnit::adopt(torch::nn::Module& inner) { share_registrations(inner, *this); }

torch::Tensor ShardedUnit::run(const torch::Tensor& x,
                               const std::function<torch::Tensor(const torch::Tensor&)>& inner_forward) {
  models::UnitObserver* observer = observer_ != nullptr ? *observer_ : nullptr;
  if (observer != nullptr) observer->before_unit(index_);
  torch::Tensor y = checkpointing_ && is_training() && torch::GradMode::is_enabled()
                        ? models::checkpoint(inner_forward, x, *this)
                        : inner_forward(x);
  if (observer != nullptr) observer->after_unit(index_, y);
  return y;
}

ModuleModel::ModuleModel(std::shared_ptr<torch::nn::Module> module, std::function<torch::Tensor(torch::Tensor)> forward,
                         std::string name, std::function<std::shared_ptr<ModuleModel>()> make_copy)
    : module_(std::move(module)), forward_(std::move(forward)), name_(std::move(name)), make_copy_(std::move(make_copy)) {
  check(module_ != nullptr && forward_ != nullptr, "ptrain::wrap: model '" + name_ + "' needs a module and its forward");
  share_registrations(*module_, *this);
  for (const auto& item : module_->named_modules("", /*include_self=*/false)) {
    auto unit = std::dynamic_pointer_cast<ShardedUnit>(item.value());
    if (!unit) continue;
    for (const auto& [outer, ignored] : units_) {
      check(item.key().rfind(outer + ".", 0) != 0, "ptrain::fully_shard: '" + item.key() + "' of model '" + name_ +
                                                       "' lies inside the unit '" + outer + "'; units must not nest");
    }
    unit->attach(units_.size(), &observer_);
    units_.emplace_back(item.key(), unit);
  }
  train(module_->is_training());
}

torch::Tensor ModuleModel::forward(torch::Tensor x) { return forward_(std::move(x)); }

void ModuleModel::set_activation_checkpointing(bool on) {
  check(!on || !units_.empty(), "--activation-checkpointing recomputes a model's units, and model '" + name_ +
                                    "' has none: mark the blocks to recompute with ptrain::fully_shard");
  for (auto& [name, unit] : units_) unit->set_checkpointing(on);
}

std::shared_ptr<models::Model> ModuleModel::make_replica() const {
  check(make_copy_ != nullptr, "--strategy dp keeps a copy of model '" + name_ +
                                   "' on every device: give ptrain::wrap a function that builds a fresh module");
  auto copy = make_copy_();
  copy->train(is_training());
  return copy;
}

std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> ModuleModel::units() {
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> result;
  for (const auto& [name, unit] : units_) result.emplace_back(name, unit);
  return result;
}

torch::Tensor ModuleModel::forward_unit(size_t, torch::Tensor) {
  throw Error("model '" + name_ + "' runs its units from its own forward; forward_unit is not offered");
}

void ModuleModel::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  models::to_floating_point(*this, device, dtype, non_blocking);
}
void ModuleModel::to(torch::Dtype dtype, bool non_blocking) {
  models::to_floating_point(*this, c10::nullopt, dtype, non_blocking);
}
void ModuleModel::to(torch::Device device, bool non_blocking) { torch::nn::Module::to(device, non_blocking); }

}  // namespace ptrain
