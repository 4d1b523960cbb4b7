#include <gtest/gtest.h>

#include <map>

#include "ptrain/io/pth.h"
#include "ptrain/metrics/cpu_allocator.h"
#include "ptrain/train/optimizer.h"
#include "test_support.h"  // tests/support: temporary directories, oracles

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

ptrain::train::OptimizerOptions config_for(const std::string& optimizer) {
  ptrain::train::OptimizerOptions c;
  if (optimizer == "adamw") {
    c.kind = ptrain::train::OptimizerKind::adamw;
    c.lr = 1e-2;
    c.weight_decay = 0.01;
  } else {
    c.kind = ptrain::train::OptimizerKind::sgd;
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

// Updating in batches (large tensors in slices) gives every element the update of one pass over
// everything, skipped steps included, while the step's temporaries stay a few batches large.
void batches_change_nothing_but_the_peak(const std::string& optimizer) {
  ptrain::metrics::install_cpu_allocation_counter();
  torch::manual_seed(4);
  const auto c = config_for(optimizer);
  // One tensor of 40,000 elements (sliced by a 1,000-element batch), and small ones that share batches.
  const std::vector<std::vector<int64_t>> shapes{{200, 200}, {7}, {3, 5}, {900}};
  std::vector<torch::Tensor> whole, sliced;
  std::vector<std::string> names;
  for (size_t i = 0; i < shapes.size(); ++i) {
    whole.push_back(torch::randn(shapes[i]));
    sliced.push_back(whole.back().clone());
    names.push_back("w" + std::to_string(i));
  }
  auto one_pass = ptrain::train::make_optimizer(c, whole, names, int64_t{1} << 30);
  auto batched = ptrain::train::make_optimizer(c, sliced, names, 1000);
  auto clean = torch::zeros({}), inf = torch::ones({});
  int64_t peak_one_pass = 0, peak_batched = 0;
  for (int step = 0; step < 4; ++step) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      auto g = step == 2 ? torch::full(shapes[i], std::numeric_limits<float>::infinity()) : torch::randn(shapes[i]);
      whole[i].mutable_grad() = g.clone();
      sliced[i].mutable_grad() = g.clone();
    }
    const torch::Tensor* found_inf = step == 0 ? nullptr : step == 2 ? &inf : &clean;
    ptrain::metrics::reset_cpu_allocator_peak();
    const int64_t before = ptrain::metrics::cpu_allocated_bytes();
    one_pass->step(c.lr, found_inf);
    peak_one_pass = std::max(peak_one_pass, ptrain::metrics::cpu_peak_allocated_bytes() - before);
    ptrain::metrics::reset_cpu_allocator_peak();
    batched->step(c.lr, found_inf);
    peak_batched = std::max(peak_batched, ptrain::metrics::cpu_peak_allocated_bytes() - before);
    for (size_t i = 0; i < shapes.size(); ++i) EXPECT_TRUE(torch::equal(whole[i], sliced[i])) << names[i] << " step " << step;
  }
  const auto a = one_pass->state(), b = batched->state();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
  // One pass holds temporaries of all 41,922 elements at once; batches, of 1,000 or so at a time.
  EXPECT_GT(peak_one_pass, 41922 * 4);
  EXPECT_LT(peak_batched, peak_one_pass / 8) << "batched " << peak_batched << " bytes, one pass " << peak_one_pass;
}

TEST(Optimizer, SgdInBatchesIsTheSameUpdateWithSmallerTemporaries) { batches_change_nothing_but_the_peak("sgd"); }
TEST(Optimizer, AdamWInBatchesIsTheSameUpdateWithSmallerTemporaries) { batches_change_nothing_but_the_peak("adamw"); }

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
