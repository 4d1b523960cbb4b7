#include <gtest/gtest.h>

#include <map>

#include "ptrain/io/pth.h"
#include "ptrain/train/optimizer.h"
#include "test_support.h"  // tests/io: temporary directories, oracles

namespace {

double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  return (got.to(torch::kDouble) - want.to(torch::kDouble)).norm().item<double>() /
         std::max(1e-30, want.to(torch::kDouble).norm().item<double>());
}

std::map<std::string, torch::Tensor> load_reference(const std::string& optimizer) {
  ptrain::testing::TempDir dir;
  const auto path = dir.file("reference.pth");
  const auto oracle = ptrain::testing::run_oracle("optimizer_reference.py", "--optimizer " + optimizer + " --out " + path);
  EXPECT_EQ(oracle.exit_code, 0) << oracle.output;
  std::map<std::string, torch::Tensor> by_name;
  for (auto& [name, tensor] : ptrain::io::read_pth(path)) by_name[name] = tensor;
  return by_name;
}

ptrain::config::OptimizerConfig config_for(const std::string& optimizer) {
  ptrain::config::OptimizerConfig c;
  if (optimizer == "adamw") {
    c.name = "adamw";
    c.lr = 1e-2;
    c.weight_decay = 0.01;
  } else {
    c.name = "sgd";
    c.lr = 0.1;
    c.momentum = 0.9;
    c.nesterov = optimizer == "sgd-nesterov";
    c.weight_decay = 5e-4;
  }
  return c;
}

void replay_matches_torch_optim(const std::string& optimizer) {
  auto ref = load_reference(optimizer);
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  for (int i = 0; i < 3; ++i) {
    params.push_back(ref.at("init." + std::to_string(i)).clone());
    names.push_back("p" + std::to_string(i));
  }
  const auto c = config_for(optimizer);
  auto opt = ptrain::train::make_optimizer(c, params, names);
  for (int s = 0; s < 5; ++s) {
    for (int i = 0; i < 3; ++i) params[i].mutable_grad() = ref.at("grad." + std::to_string(s) + "." + std::to_string(i));
    opt->step(c.lr, nullptr);
    for (int i = 0; i < 3; ++i) {
      const auto& want = ref.at("after." + std::to_string(s) + "." + std::to_string(i));
      EXPECT_LT(relative_error(params[i], want), 1e-6) << optimizer << " step " << s << " param " << i;
    }
  }
}

TEST(Optimizer, SgdMatchesTorchOptim) { replay_matches_torch_optim("sgd"); }
TEST(Optimizer, SgdNesterovMatchesTorchOptim) { replay_matches_torch_optim("sgd-nesterov"); }
TEST(Optimizer, AdamWMatchesTorchOptim) { replay_matches_torch_optim("adamw"); }

// A step flagged by the loss scaler must leave parameters and state exactly as they were, and the next
// clean step must then equal a clean step of an optimizer that never saw the overflow.
void skipped_step_changes_nothing(const std::string& optimizer) {
  torch::manual_seed(3);
  const auto c = config_for(optimizer);
  auto a = torch::randn({4, 5}), b = a.clone();
  auto opt_a = ptrain::train::make_optimizer(c, {a}, {"w"});
  auto opt_b = ptrain::train::make_optimizer(c, {b}, {"w"});
  auto g1 = torch::randn({4, 5}), g2 = torch::randn({4, 5});
  auto clean = torch::zeros({}), inf = torch::ones({});

  a.mutable_grad() = g1.clone();
  b.mutable_grad() = g1.clone();
  opt_a->step(c.lr, &clean);
  opt_b->step(c.lr, nullptr);
  EXPECT_TRUE(torch::equal(a, b));

  const auto before = a.clone();
  const auto state_before = opt_a->state();
  a.mutable_grad() = torch::full({4, 5}, std::numeric_limits<float>::infinity());
  opt_a->step(c.lr, &inf);
  EXPECT_TRUE(torch::equal(a, before)) << "a skipped step moved the weights";
  const auto state_after = opt_a->state();
  ASSERT_EQ(state_before.size(), state_after.size());
  for (size_t i = 0; i < state_after.size(); ++i) {
    EXPECT_TRUE(torch::equal(state_before[i].second, state_after[i].second)) << state_after[i].first;
  }

  a.mutable_grad() = g2.clone();
  b.mutable_grad() = g2.clone();
  opt_a->step(c.lr, &clean);
  opt_b->step(c.lr, nullptr);
  EXPECT_LT(relative_error(a, b), 1e-7);
}

TEST(Optimizer, SgdSkippedStepChangesNothing) { skipped_step_changes_nothing("sgd"); }
TEST(Optimizer, AdamWSkippedStepChangesNothing) { skipped_step_changes_nothing("adamw"); }

TEST(Optimizer, StateRoundTripsAndMismatchIsNamed) {
  const auto c = config_for("adamw");
  auto w = torch::randn({3});
  auto opt = ptrain::train::make_optimizer(c, {w}, {"layer.weight"});
  w.mutable_grad() = torch::randn({3});
  opt->step(c.lr, nullptr);
  auto state = opt->state();

  auto w2 = w.clone();
  auto opt2 = ptrain::train::make_optimizer(c, {w2}, {"layer.weight"});
  opt2->load_state(state, "ckpt.safetensors");
  const auto state2 = opt2->state();
  for (size_t i = 0; i < state.size(); ++i) EXPECT_TRUE(torch::equal(state[i].second, state2[i].second));

  auto other = torch::randn({4});
  auto opt3 = ptrain::train::make_optimizer(c, {other}, {"layer.weight"});
  const std::string message =
      ptrain::testing::error_message<std::exception>([&] { opt3->load_state(state, "ckpt.safetensors"); });
  EXPECT_NE(message.find("ckpt.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("layer.weight.exp_avg"), std::string::npos) << message;
}

}  // namespace
