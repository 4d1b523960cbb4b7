// DDP parity: N ranks each on 1/N of a fixed global batch must end where one process on the whole batch
// ends. The reference runs in the parent after the ranks have finished (see tests/support/multiprocess.h).
#include <gtest/gtest.h>

#include <chrono>

#include "multiprocess.h"
#include "ptrain/core/error.h"
#include "ptrain/strategies/ddp.h"
#include "parity.h"
#include "ptrain/models/batch_norm.h"

namespace ptrain::strategies {
namespace {

using namespace std::chrono_literals;
using namespace parity;

void train_rank(const RunSetup& s, int rank, int world, int port, const std::string& out) {
  auto group = std::make_shared<distributed::ProcessGroup>(testing::loopback(rank, world, port), "gloo", 20s);
  // Ranks start from different weights: prepare() must copy rank 0's.
  auto model = make_model(s, 100 + rank);
  model->train();
  DdpOptions options;
  options.sync_batchnorm = s.sync_batchnorm;
  options.bucket_cap_mb = s.bucket_cap_mb;
  options.first_bucket_mb = s.first_bucket_mb;
  DistributedDataParallel ddp(group, torch::kCPU, options);
  ddp.prepare(*model);
  const int64_t local = kGlobalBatch / world;
  const int64_t micro = local / s.accumulation;
  for (int step = 0; step < s.steps; ++step) {
    const auto batch = global_batch(step, s.images);
    for (int m = 0; m < s.accumulation; ++m) {
      ddp.set_gradient_sync(m == s.accumulation - 1);
      const int64_t begin = rank * local + m * micro;
      const auto out = ddp.forward(*model, batch.x.narrow(0, begin, micro));
      (torch::mse_loss(out, batch.y.narrow(0, begin, micro)) / s.accumulation).backward();
    }
    ddp.finish_backward();
    clip(*model, s.clip);
    sgd_step(*model, s.lr);
  }
  torch::save(state_of(*model), out + "/rank" + std::to_string(rank) + ".pt");
}

// The largest relative difference of any rank's final state from the reference.
double parity_gap(const RunSetup& s, int world) {
  const int port = testing::free_port();
  const std::string dir = testing::temp_dir("ddp");
  const auto outcomes = testing::run_world(world, [&](int rank) { train_rank(s, rank, world, port, dir); }, 60);
  for (size_t r = 0; r < outcomes.size(); ++r) {
    EXPECT_EQ(outcomes[r].exit_code, 0) << "rank " << r << ": " << outcomes[r].message;
    if (outcomes[r].exit_code != 0) return 1e300;
  }
  int clipped_steps = 0;
  const auto reference = train_reference(s, &clipped_steps);
  if (s.clip > 0) {
    EXPECT_GT(clipped_steps, 0) << "the clip threshold never bit: the test would not check clipping";
  }
  double worst = 0;
  for (int r = 0; r < world; ++r) {
    std::vector<torch::Tensor> state;
    torch::load(state, dir + "/rank" + std::to_string(r) + ".pt");
    EXPECT_EQ(state.size(), reference.size());
    size_t index = 0;
    const double gap = worst_relative_difference(state, reference, &index);
    if (gap > s.tolerance) ADD_FAILURE() << "rank " << r << " tensor " << index << ": " << gap;
    worst = std::max(worst, gap);
  }
  return worst;
}

void expect_parity(const RunSetup& s, int world) { EXPECT_LE(parity_gap(s, world), s.tolerance); }

TEST(Ddp, ParityTwoRanks) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  expect_parity({}, 2);
}
TEST(Ddp, ParityThreeRanksSmallBuckets) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  RunSetup s;
  s.first_bucket_mb = 100.0 / (1 << 20);  // ~100 bytes: several buckets, several all-reduces in flight
  s.bucket_cap_mb = 300.0 / (1 << 20);
  expect_parity(s, 3);
}
TEST(Ddp, ParityWithAccumulationTwoRanks) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  RunSetup s;
  s.accumulation = 2;
  expect_parity(s, 2);
}
TEST(Ddp, ParityWithAccumulationThreeRanks) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  RunSetup s;
  s.accumulation = 2;
  s.first_bucket_mb = 100.0 / (1 << 20);
  expect_parity(s, 3);
}
TEST(Ddp, ParityWithGradientClipping) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  RunSetup s;
  s.clip = 0.05;
  s.accumulation = 2;
  expect_parity(s, 3);
}
TEST(Ddp, SyncBatchNormMatchesOneProcessOnTheWholeBatch) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  RunSetup s;
  s.images = true;
  s.sync_batchnorm = true;
  expect_parity(s, 2);
  expect_parity(s, 3);
}

// The zoo's ResNet reaches its norm layers through typed handles; synchronisation must still take hold.
// Its last stage normalises 1x1 maps of a few samples, which makes the comparison ill-conditioned, so
// it is one step at 1e-4, with a control showing that unsynchronised BatchNorm misses by far more.
TEST(Ddp, SyncBatchNormOfTheZooResNetMatchesOneProcessOnTheWholeBatch) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  RunSetup s;
  s.images = true;
  s.zoo_resnet = true;
  s.steps = 1;
  s.tolerance = 1e-4;
  s.sync_batchnorm = true;
  expect_parity(s, 2);
  expect_parity(s, 3);
  s.sync_batchnorm = false;
  s.tolerance = 1e300;
  EXPECT_GT(parity_gap(s, 2), 1e-2);
}

TEST(Ddp, BucketsFollowReverseRegistrationOrderAndCaps) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const auto outcomes = testing::run_world(
      1,
      [&](int rank) {
        auto group = std::make_shared<distributed::ProcessGroup>(testing::loopback(rank, 1, testing::free_port()), "gloo", 5s);
        Mlp model;  // parameters: fc1.w (96 floats), fc1.b (16), fc2.w (48), fc2.b (3), unused.w (4), unused.b (2)
        DdpOptions options;
        options.first_bucket_mb = 20.0 / (1 << 20);  // 20 bytes: closes after unused.b + unused.w (24 bytes)
        options.bucket_cap_mb = 200.0 / (1 << 20);   // 200 bytes: fc2.b + fc2.w (204), then fc1.b + fc1.w
        DistributedDataParallel ddp(group, torch::kCPU, options);
        ddp.prepare(model);
        const std::vector<std::vector<size_t>> expected{{5, 4}, {3, 2}, {1, 0}};
        if (ddp.bucket_layout() != expected) throw std::runtime_error("unexpected bucket layout");
      },
      30);
  EXPECT_EQ(outcomes[0].exit_code, 0) << outcomes[0].message;
}

TEST(Ddp, SyncBatchNormRefusesModelsThatBypassTheSwap) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const auto outcomes = testing::run_world(
      1,
      [&](int rank) {
        auto group = std::make_shared<distributed::ProcessGroup>(testing::loopback(rank, 1, testing::free_port()), "gloo", 5s);
        MemberBnNet model;
        DdpOptions options;
        options.sync_batchnorm = true;
        DistributedDataParallel ddp(group, torch::kCPU, options);
        ddp.prepare(model);
        ddp.forward(model, torch::randn({4, 3, 4, 4}));
      },
      30);
  EXPECT_EQ(outcomes[0].exit_code, 1);
  EXPECT_NE(outcomes[0].message.find("--sync-batchnorm"), std::string::npos) << outcomes[0].message;
  EXPECT_NE(outcomes[0].message.find("'bn'"), std::string::npos) << outcomes[0].message;
}

}  // namespace
}  // namespace ptrain::strategies
