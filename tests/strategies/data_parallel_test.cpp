// DP parity: N replicas in one process, each on 1/N of every batch, must end where one model trained on
// the whole batch ends; and the replicas are made once, keep the model's thread-local modes, and follow
// PyTorch DataParallel's BatchNorm semantics.
#include <gtest/gtest.h>

#include <mutex>
#include <set>
#include <thread>

#include "parity.h"
#include "ptrain/core/error.h"
#include "ptrain/precision/autocast_guard.h"
#include "ptrain/strategies/data_parallel.h"

namespace ptrain::strategies {
namespace {

using namespace parity;

std::vector<torch::Device> cpu_replicas(int n) { return std::vector<torch::Device>(n, torch::Device(torch::kCPU)); }

std::vector<torch::Tensor> train_dp(const RunSetup& s, int replicas) {
  auto model = make_model(s, 100);
  model->train();
  DataParallel dp(cpu_replicas(replicas));
  dp.prepare(*model);
  const int64_t micro = kGlobalBatch / s.accumulation;
  for (int step = 0; step < s.steps; ++step) {
    const auto batch = global_batch(step, s.images);
    for (int m = 0; m < s.accumulation; ++m) {
      dp.set_gradient_sync(m == s.accumulation - 1);
      const auto out = dp.forward(*model, batch.x.narrow(0, m * micro, micro));
      (torch::mse_loss(out, batch.y.narrow(0, m * micro, micro)) / s.accumulation).backward();
    }
    dp.finish_backward();
    clip(*model, s.clip);
    sgd_step(*model, s.lr);
  }
  return state_of(*model);
}

void expect_parity(const RunSetup& s, int replicas) {
  int clipped_steps = 0;
  const auto reference = train_reference(s, &clipped_steps);
  if (s.clip > 0) { EXPECT_GT(clipped_steps, 0) << "the clip threshold never bit: the test would not check clipping"; }
  const auto state = train_dp(s, replicas);
  ASSERT_EQ(state.size(), reference.size());
  size_t worst = 0;
  EXPECT_LE(worst_relative_difference(state, reference, &worst), 1e-5) << "tensor " << worst;
  // The check must be able to fail: the same run on a single replica's share alone ends elsewhere.
  EXPECT_GT(worst_relative_difference(reference, train_reference(s, nullptr, kGlobalBatch / replicas)), 1e-3);
}

TEST(DataParallel, ParityTwoReplicas) { expect_parity({}, 2); }
TEST(DataParallel, ParityThreeReplicas) { expect_parity({}, 3); }
TEST(DataParallel, ParityWithAccumulation) {
  RunSetup s;
  s.accumulation = 2;
  expect_parity(s, 2);
  expect_parity(s, 3);
}
TEST(DataParallel, ParityWithGradientClipping) {
  RunSetup s;
  s.clip = 0.05;
  s.accumulation = 2;
  expect_parity(s, 3);
}

// DataParallel's BatchNorm: each replica normalises with its own part's statistics, and the running
// statistics are those the first replica (the model itself) computed.
TEST(DataParallel, BatchNormNormalisesPerReplicaAndKeepsTheFirstReplicasRunningStatistics) {
  RunSetup s;
  s.images = true;
  auto model = make_model(s, 7);
  auto twin = make_model(s, 7);
  model->train();
  twin->train();
  DataParallel dp(cpu_replicas(2));
  dp.prepare(*model);
  const auto batch = global_batch(0, true);
  const auto out = dp.forward(*model, batch.x);

  torch::NoGradGuard no_grad;
  auto running = state_of(*twin);  // before: snapshot to restore the second part's update
  const auto first = twin->forward(batch.x.narrow(0, 0, kGlobalBatch / 2));
  const auto after_first = state_of(*twin);
  const auto second = twin->forward(batch.x.narrow(0, kGlobalBatch / 2, kGlobalBatch / 2));
  EXPECT_LT((out - torch::cat({first, second})).abs().max().item<double>(), 1e-5);
  EXPECT_LT(worst_relative_difference(state_of(*model), after_first), 1e-6);
  EXPECT_GT(worst_relative_difference(after_first, running), 1e-4) << "the forward left the statistics unchanged";
}

TEST(DataParallel, ReplicasRunUnderTheCallersAutocastAndGradMode) {
  RunSetup s;
  s.images = true;
  auto model = make_model(s, 3);
  model->eval();
  DataParallel dp(cpu_replicas(2));
  dp.prepare(*model);
  const auto x = global_batch(1, true).x;
  torch::NoGradGuard no_grad;
  precision::AutocastGuard autocast(c10::DeviceType::CPU, true, torch::kBFloat16);
  const auto out = dp.forward(*model, x);
  const auto expected = model->forward(x.narrow(0, kGlobalBatch / 2, kGlobalBatch / 2));
  EXPECT_EQ(expected.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
  EXPECT_FALSE(out.requires_grad());
  EXPECT_TRUE(out.narrow(0, kGlobalBatch / 2, kGlobalBatch / 2).equal(expected));
}

// LibTorch caches cuDNN's plans per thread: a replica that moved to a new thread each step would be
// tuned again every step.
TEST(DataParallel, EachReplicaKeepsItsThreadForTheWholeRun) {
  struct Threads {
    std::mutex mutex;
    std::vector<std::thread::id> ids;
  };
  struct Noting : Mlp {
    explicit Noting(std::shared_ptr<Threads> t) : threads(std::move(t)) {}
    torch::Tensor forward(torch::Tensor x) override {
      std::lock_guard<std::mutex> lock(threads->mutex);
      threads->ids.push_back(std::this_thread::get_id());
      return Mlp::forward(x);
    }
    std::shared_ptr<Model> make_replica() const override { return std::make_shared<Noting>(threads); }
    std::shared_ptr<Threads> threads;
  };
  auto threads = std::make_shared<Threads>();
  auto model = std::make_shared<Noting>(threads);
  DataParallel dp(cpu_replicas(3));
  dp.prepare(*model);
  for (int step = 0; step < 4; ++step) dp.forward(*model, global_batch(step, false).x);
  std::set<std::thread::id> others(threads->ids.begin(), threads->ids.end());
  others.erase(std::this_thread::get_id());
  EXPECT_EQ(threads->ids.size(), 12u);
  EXPECT_EQ(others.size(), 2u) << "two replicas beside the model, each on one thread for all four steps";
}

TEST(DataParallel, ABatchSmallerThanTheReplicasLeavesSomeIdle) {
  RunSetup s;
  auto model = make_model(s, 5);
  DataParallel dp(cpu_replicas(3));
  dp.prepare(*model);
  const auto x = global_batch(0, false).x.narrow(0, 0, 2);
  const auto out = dp.forward(*model, x);
  EXPECT_EQ(out.size(0), 2);
  torch::mse_loss(out, torch::zeros_like(out)).backward();
  dp.finish_backward();
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.grad().defined());
}

TEST(DataParallel, ModelsWithoutReplicasAreRefusedByName) {
  struct Plain : models::Model {
    Plain() { register_module("fc", torch::nn::Linear(2, 2)); }
    torch::Tensor forward(torch::Tensor x) override { return x; }
    std::string name() const override { return "plain"; }
    std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> units() override { return {}; }
    torch::Tensor forward_unit(size_t, torch::Tensor x) override { return x; }
  };
  auto model = std::make_shared<Plain>();
  DataParallel dp(cpu_replicas(2));
  try {
    dp.prepare(*model);
    FAIL() << "prepare accepted a model without make_replica";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'plain'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ptrain::strategies
