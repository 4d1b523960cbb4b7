// What the parity tests of the data-parallel strategies share: small models, a fixed global batch per
// step, plain SGD, and the reference they must match, one process training on the whole batch.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "ptrain/models/model.h"
#include "ptrain/models/zoo.h"
#include "ptrain/strategies/sync_batchnorm.h"

namespace ptrain::strategies::parity {

constexpr int64_t kGlobalBatch = 12;
constexpr int kSteps = 20;
constexpr double kLr = 0.1;

class Mlp : public models::Model {
 public:
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
    unused = register_module("unused", torch::nn::Linear(2, 2));  // never in forward: must not deadlock
  }
  torch::Tensor forward(torch::Tensor x) override { return fc2(torch::tanh(fc1(x))); }
  std::string name() const override { return "mlp"; }
  std::shared_ptr<Model> make_replica() const override { return std::make_shared<Mlp>(); }
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> units() override { return {}; }
  torch::Tensor forward_unit(size_t, torch::Tensor x) override { return forward(x); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, unused{nullptr};
};

// Reaches its norm layer through the registered child, so convert_sync_batchnorm's swap takes effect.
class BnNet : public models::Model {
 public:
  BnNet() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)));
    register_module("bn", torch::nn::BatchNorm2d(4));
    fc = register_module("fc", torch::nn::Linear(4, 3));
  }
  torch::Tensor forward(torch::Tensor x) override {
    x = conv(x);
    auto norm = named_children()["bn"];
    if (auto* sync = norm->as<SyncBatchNorm2dImpl>()) {
      x = sync->forward(x);
    } else {
      x = norm->as<torch::nn::BatchNorm2dImpl>()->forward(x);
    }
    return fc(torch::relu(x).mean({2, 3}));
  }
  std::string name() const override { return "bnnet"; }
  std::shared_ptr<Model> make_replica() const override { return std::make_shared<BnNet>(); }
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> units() override { return {}; }
  torch::Tensor forward_unit(size_t, torch::Tensor x) override { return forward(x); }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::Linear fc{nullptr};
};

// Calls its BatchNorm through a member handle, like the zoo's ResNet.
class MemberBnNet : public BnNet {
 public:
  MemberBnNet() { bn = named_children()["bn"]->as<torch::nn::BatchNorm2dImpl>()->shared_from_this(); }
  torch::Tensor forward(torch::Tensor x) override {
    return fc(torch::relu(std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(bn)->forward(conv(x))).mean({2, 3}));
  }
  std::shared_ptr<torch::nn::Module> bn;
};

struct Batch {
  torch::Tensor x, y;
};

inline Batch global_batch(int step, bool images) {
  torch::manual_seed(1000 + step);
  auto x = images ? torch::randn({kGlobalBatch, 3, 4, 4}) * 2 + 0.5 : torch::randn({kGlobalBatch, 6});
  return {x, torch::randn({kGlobalBatch, 3})};
}

struct RunSetup {
  int accumulation = 1;
  double clip = 0;  // global-norm clip threshold; 0 = none
  bool images = false;
  bool sync_batchnorm = false;
  bool zoo_resnet = false;  // the zoo's resnet20 (3 classes, 4x4 images) instead of the small test models
  // Twenty steps on random targets make a 20-layer ResNet chaotic (a 1e-7 change of the initial weights
  // ends 0.66 away): deep models are compared after a few steps, where rounding has not grown yet.
  double lr = kLr;
  int steps = kSteps;
  double tolerance = 1e-5;  // largest relative difference from the reference
  double bucket_cap_mb = 25;
  double first_bucket_mb = 1;
};

inline std::shared_ptr<models::Model> make_model(const RunSetup& s, int seed) {
  torch::manual_seed(seed);
  if (s.zoo_resnet) return models::make_model({"resnet20", 3, 3, 4});
  if (s.images) return std::make_shared<BnNet>();
  return std::make_shared<Mlp>();
}

inline void sgd_step(models::Model& model, double lr = kLr) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    if (!p.grad().defined()) continue;
    p.sub_(p.grad() * lr);
    p.grad().zero_();
  }
}

// Returns true when clipping changed the gradients.
inline bool clip(models::Model& model, double max_norm) {
  if (max_norm <= 0) return false;
  return torch::nn::utils::clip_grad_norm_(model.parameters(), max_norm) > max_norm;
}

inline std::vector<torch::Tensor> state_of(models::Model& model) {
  std::vector<torch::Tensor> state;
  for (const auto& p : model.parameters()) state.push_back(p.detach().clone());
  for (const auto& b : model.buffers()) state.push_back(b.detach().clone().to(torch::kDouble));
  return state;
}

// One process, whole batch, plain modules: the reference. With rows < kGlobalBatch, only the first rows of
// each batch: what one replica alone would learn (a control that the comparison can fail).
inline std::vector<torch::Tensor> train_reference(const RunSetup& s, int* clipped_steps, int64_t rows = kGlobalBatch) {
  auto model = make_model(s, 100);
  model->train();
  int clipped = 0;
  for (int step = 0; step < s.steps; ++step) {
    const auto batch = global_batch(step, s.images);
    torch::mse_loss(model->forward(batch.x.narrow(0, 0, rows)), batch.y.narrow(0, 0, rows)).backward();
    if (clip(*model, s.clip)) ++clipped;
    sgd_step(*model, s.lr);
  }
  if (clipped_steps) *clipped_steps = clipped;
  return state_of(*model);
}

// Largest difference of each tensor relative to the reference's largest magnitude (at least 1e-3).
inline double worst_relative_difference(const std::vector<torch::Tensor>& state, const std::vector<torch::Tensor>& reference,
                                        size_t* worst_index = nullptr) {
  double worst = 0;
  for (size_t i = 0; i < state.size() && i < reference.size(); ++i) {
    const double scale = std::max(reference[i].abs().max().item<double>(), 1e-3);
    const double diff = (state[i] - reference[i]).abs().max().item<double>() / scale;
    if (diff > worst) {
      worst = diff;
      if (worst_index) *worst_index = i;
    }
  }
  return worst;
}

}  // namespace ptrain::strategies::parity
