#include "ptrain/strategies/strategy.h"

#include <map>

#include "ptrain/core/error.h"
#include "ptrain/strategies/master_weights.h"

namespace ptrain::strategies {

int64_t bytes_of(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

io::NamedTensors UpdateTarget::local_shards(const io::NamedTensors&, nlohmann::json*) {
  throw Error("--state-dict sharded: this strategy holds every parameter whole on each rank; its checkpoints are full "
              "(--state-dict full)");
}

namespace {

// Every rank holds every parameter and the same reduced gradients: nothing to agree on or gather.
class ReplicatedTarget final : public UpdateTarget {
 public:
  ReplicatedTarget(models::Model& model, bool master_weights) {
    for (const auto& item : model.named_parameters()) {
      model_names_.push_back(item.key());
      model_params_.push_back(item.value());
    }
    if (master_weights) masters_ = std::make_unique<MasterWeights>(model_params_);
  }

  const std::vector<torch::Tensor>& params() const override { return masters_ ? masters_->masters() : model_params_; }
  const std::vector<std::string>& names() const override { return model_names_; }

  void gradients_ready() override {
    if (masters_) masters_->copy_grads_to_masters();
  }
  void agree_found_inf(const torch::Tensor&) override {}
  torch::Tensor global_norm(const torch::Tensor& local_norm) override { return local_norm; }
  void parameters_updated() override {
    if (masters_) masters_->copy_masters_to_params();
  }

  io::NamedTensors full_parameters() override {
    io::NamedTensors out;
    for (size_t i = 0; i < model_names_.size(); ++i) out.emplace_back(model_names_[i], params()[i].detach());
    return out;
  }
  io::NamedTensors full_optimizer_state(const io::NamedTensors& state) override { return state; }
  io::NamedTensors local_optimizer_state(const io::NamedTensors& full) override { return full; }

  void load_full_parameters(const io::NamedTensors& full, const std::string& source) override {
    std::map<std::string, torch::Tensor> by_name(full.begin(), full.end());
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < model_names_.size(); ++i) {
      auto it = by_name.find(model_names_[i]);
      check(it != by_name.end(), source + ": parameter '" + model_names_[i] + "' is missing");
      check(it->second.sizes() == model_params_[i].sizes(),
            source + ": parameter '" + model_names_[i] + "' has shape " + c10::str(it->second.sizes()) + ", expected " +
                c10::str(model_params_[i].sizes()));
      model_params_[i].copy_(it->second);
      // The checkpoint holds the fp32 masters themselves: reloading them from the rounded half weights
      // would lose what made them worth keeping.
      if (masters_) masters_->masters()[i].copy_(it->second);
    }
  }

  ModelStateBytes model_state_bytes(const io::NamedTensors& optimizer_state) const override {
    ModelStateBytes bytes;
    for (const auto& p : model_params_) {
      bytes.params += bytes_of(p);
      bytes.grads += bytes_of(p);  // each parameter's .grad, of its size and dtype
    }
    if (masters_) {
      for (const auto& m : masters_->masters()) bytes.optimizer += bytes_of(m);
    }
    for (const auto& [name, t] : optimizer_state) bytes.optimizer += bytes_of(t);
    return bytes;
  }

 private:
  std::vector<std::string> model_names_;
  std::vector<torch::Tensor> model_params_;
  std::unique_ptr<MasterWeights> masters_;
};

}  // namespace

std::unique_ptr<UpdateTarget> replicated_update_target(models::Model& model, bool master_weights) {
  return std::make_unique<ReplicatedTarget>(model, master_weights);
}

std::unique_ptr<UpdateTarget> Strategy::update_target(models::Model& model, bool master_weights) {
  return replicated_update_target(model, master_weights);
}

}  // namespace ptrain::strategies
