// Your own LibTorch module, trained by ptrain under any strategy and precision.
//
//   struct Net : torch::nn::Module {
//     Net() {
//       stem = register_module("stem", torch::nn::Conv2d(3, 32, 3));
//       block = register_module("block", ptrain::fully_shard(std::make_shared<Block>(32)));  // a unit
//       head = register_module("head", torch::nn::Linear(32, 10));
//     }
//     torch::Tensor forward(torch::Tensor x) { return head(block->forward(stem(x)).mean({2, 3})); }
//     torch::nn::Conv2d stem{nullptr};
//     std::shared_ptr<ptrain::Sharded<Block>> block;
//     torch::nn::Linear head{nullptr};
//   };
//   auto model = ptrain::wrap(std::make_shared<Net>(), "net");
//
// fully_shard marks a submodule as a unit of zero3 and fsdp, in the manner of PyTorch FSDP2's
// fully_shard: its parameters are one flat group, gathered just before its forward and again before its
// backward, and freed after each; what no unit holds is the root, gathered for the whole forward. LibTorch
// modules have no forward hooks, so the marked module is wrapped: Sharded<M> holds M's parameters under
// M's own names (state_dict keys do not change) and its forward(x) calls M's between the strategy's
// gather and release. Units also are what --activation-checkpointing recomputes.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ptrain/models/model.h"

namespace ptrain {

// What every Sharded<M> shares: its place among the model's units and how its forward is run.
class ShardedUnit : public torch::nn::Module {
 public:
  explicit ShardedUnit(std::string type_name) : torch::nn::Module(std::move(type_name)) {}

  // ModuleModel sets these when it finds the unit.
  void attach(size_t index, models::UnitObserver** observer) {
    index_ = index;
    observer_ = observer;
  }
  void set_checkpointing(bool on) { checkpointing_ = on; }

 protected:
  // Holds the very tensors and submodules of `inner` under their names.
  void adopt(torch::nn::Module& inner);
  torch::Tensor run(const torch::Tensor& x, const std::function<torch::Tensor(const torch::Tensor&)>& inner_forward);

 private:
  size_t index_ = 0;
  models::UnitObserver** observer_ = nullptr;
  bool checkpointing_ = false;
};

template <typename M>
class Sharded : public ShardedUnit {
 public:
  explicit Sharded(std::shared_ptr<M> inner) : ShardedUnit(inner->name()), inner_(std::move(inner)) { adopt(*inner_); }

  torch::Tensor forward(const torch::Tensor& x) {
    return run(x, [this](const torch::Tensor& in) { return inner_->forward(in); });
  }
  M& module() { return *inner_; }
  M* operator->() { return inner_.get(); }

 private:
  std::shared_ptr<M> inner_;
};

// Marks `module` as a unit (see above). Register the result where the module would have gone and call
// its forward instead of the module's.
template <typename M>
std::shared_ptr<Sharded<M>> fully_shard(std::shared_ptr<M> module) {
  return std::make_shared<Sharded<M>>(std::move(module));
}
// For LibTorch's holders (torch::nn::Linear, torch::nn::Sequential, ...).
template <typename Contained>
std::shared_ptr<Sharded<Contained>> fully_shard(torch::nn::ModuleHolder<Contained> holder) {
  return std::make_shared<Sharded<Contained>>(holder.ptr());
}

// A user's module as a ptrain model: the same parameters and buffers under the same names (it holds the
// module's own), its units the Sharded submodules in registration order.
class ModuleModel : public models::Model {
 public:
  // forward calls the module's forward (LibTorch's is not virtual; wrap() writes it); make_copy, when
  // given, builds a fresh module of the same architecture (--strategy dp keeps one per device).
  ModuleModel(std::shared_ptr<torch::nn::Module> module, std::function<torch::Tensor(torch::Tensor)> forward,
              std::string name, std::function<std::shared_ptr<ModuleModel>()> make_copy = nullptr);

  torch::Tensor forward(torch::Tensor x) override;
  void set_activation_checkpointing(bool on) override;
  std::string name() const override { return name_; }
  std::shared_ptr<Model> make_replica() const override;
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> units() override;
  torch::Tensor forward_unit(size_t index, torch::Tensor x) override;
  bool units_run_themselves() const override { return true; }
  void observe_units(models::UnitObserver* observer) override { observer_ = observer; }

  // As PyTorch's Module.to(dtype): floating-point tensors only.
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  torch::nn::Module& module() { return *module_; }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::function<torch::Tensor(torch::Tensor)> forward_;
  std::string name_;
  std::function<std::shared_ptr<ModuleModel>()> make_copy_;
  std::vector<std::pair<std::string, std::shared_ptr<ShardedUnit>>> units_;
  models::UnitObserver* observer_ = nullptr;
};

namespace detail {
// Keeps make_module's type out of template deduction, so that a lambda converts to the std::function.
template <typename T>
struct NonDeduced {
  using type = T;
};
}  // namespace detail

// wrap(module, name): M is any module with `Tensor forward(Tensor)`. make_module, when given, builds a
// fresh M (for --strategy dp); without it dp is refused.
template <typename M>
std::shared_ptr<ModuleModel> wrap(std::shared_ptr<M> module, std::string name,
                                  typename detail::NonDeduced<std::function<std::shared_ptr<M>()>>::type make_module =
                                      nullptr) {
  std::function<std::shared_ptr<ModuleModel>()> make_copy;
  if (make_module) make_copy = [make_module, name] { return wrap<M>(make_module(), name, make_module); };
  M* raw = module.get();
  return std::make_shared<ModuleModel>(
      module, [raw](torch::Tensor x) { return raw->forward(x); }, std::move(name), std::move(make_copy));
}

}  // namespace ptrain
