// Gradient reductions stay in flight during backward: rank 1 holds back its side of every reduction
// until rank 0's backward has returned, so rank 0 sees its backward return with every reduction
// launched and none completed (a sum over two ranks cannot complete before the second rank joins it).
// No timing is involved: rank 1 waits for a file rank 0 writes after looking. finish_backward then
// gives what one process computes on the whole batch.
#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "sharded_harness.h"

namespace ptrain::strategies {
namespace {

// Two linear layers, every parameter used (so every bucket and group fills during backward); with units,
// each layer is one, as the zoo's models are cut.
class TwoLayers : public models::Model {
 public:
  explicit TwoLayers(bool with_units) : with_units_(with_units) {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  torch::Tensor forward(torch::Tensor x) override { return forward_unit(1, forward_unit(0, x)); }
  std::string name() const override { return "two_layers"; }
  std::shared_ptr<Model> make_replica() const override { return std::make_shared<TwoLayers>(with_units_); }
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> units() override {
    if (!with_units_) return {};
    return {{"fc1", fc1.ptr()}, {"fc2", fc2.ptr()}};
  }
  torch::Tensor forward_unit(size_t index, torch::Tensor x) override {
    return index == 0 ? torch::tanh(fc1(x)) : fc2(x);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};

 private:
  bool with_units_;
};

constexpr int kRanks = 2;
constexpr int64_t kRowsPerRank = kGlobalBatch / kRanks;
constexpr double kTinyMb = 100.0 / (1 << 20);  // 100 bytes: a bucket or group per parameter or two

enum class Kind { ddp, zero2, zero3, fsdp_shard_grad_op };

struct InFlight {
  int64_t launched = -1;   // rank 0's reductions launched when its backward returned
  int64_t completed = -1;  // ... and completed then
  int64_t slots = -1;      // how many reductions a step has
};

std::unique_ptr<Strategy> make_strategy(Kind kind, std::shared_ptr<distributed::ProcessGroup> group) {
  if (kind == Kind::ddp) {
    DdpOptions options;
    options.first_bucket_mb = options.bucket_cap_mb = kTinyMb;
    return std::make_unique<DistributedDataParallel>(std::move(group), torch::kCPU, options);
  }
  ZeroOptions options;
  options.reduce_bucket_mb = kTinyMb;
  const StrategySpec spec = kind == Kind::zero2   ? StrategySpec(StrategyKind::zero2)
                            : kind == Kind::zero3 ? StrategySpec(StrategyKind::zero3)
                                                  : StrategySpec(StrategyKind::fsdp, FsdpSharding::shard_grad_op);
  return std::make_unique<Zero>(std::move(group), torch::kCPU, spec, options);
}

InFlight in_flight_of(Strategy& strategy) {
  if (auto* ddp = dynamic_cast<DistributedDataParallel*>(&strategy)) {
    return {static_cast<int64_t>(ddp->reductions_started()), static_cast<int64_t>(ddp->reductions_completed()),
            static_cast<int64_t>(ddp->bucket_layout().size())};
  }
  auto& zero = dynamic_cast<Zero&>(strategy);
  return {static_cast<int64_t>(zero.groups_reduced()), static_cast<int64_t>(zero.reductions_completed()),
          static_cast<int64_t>(zero.group_count())};
}

void wait_for_file(const std::string& path) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!std::ifstream(path).good()) {
    if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("rank 1: " + path + " never came");
    std::this_thread::sleep_for(5ms);
  }
}

bool has_units(Kind kind) { return kind == Kind::fsdp_shard_grad_op; }

// One step: backward, finish_backward, plain SGD on the update target; rank 0 saves what it saw when its
// backward returned and the whole parameters after the step.
void rank_body(Kind kind, int rank, int port, const std::string& dir) {
  torch::set_num_threads(1);
  auto group = std::make_shared<distributed::ProcessGroup>(testing::loopback(rank, kRanks, port), "gloo", 60s);
  torch::manual_seed(100);
  auto model = std::make_shared<TwoLayers>(has_units(kind));
  auto strategy = make_strategy(kind, group);
  strategy->prepare(*model);
  auto target = strategy->update_target(*model, false);
  const auto batch = global_batch(0, false);
  const auto rows = [&](const torch::Tensor& t) { return t.narrow(0, rank * kRowsPerRank, kRowsPerRank); };
  const auto loss = torch::mse_loss(strategy->forward(*model, rows(batch.x)), rows(batch.y));
  const std::string rank0_looked = dir + "/rank0_backward_returned";
  if (rank == 1) wait_for_file(rank0_looked);  // its side of every reduction held back until then
  loss.backward();
  if (rank == 0) {
    const auto seen = in_flight_of(*strategy);
    torch::save(torch::tensor({seen.launched, seen.completed, seen.slots}), dir + "/in_flight.pt");
    std::ofstream(rank0_looked) << "looked\n";
  }
  strategy->finish_backward();
  target->gradients_ready();
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : target->params()) torch::Tensor(p).sub_(p.grad() * kLr);
  }
  target->parameters_updated();
  const auto full = target->full_parameters();
  if (rank != 0) return;
  std::vector<torch::Tensor> values;
  for (const auto& [name, tensor] : full) values.push_back(tensor.detach().clone());
  torch::save(values, dir + "/params.pt");
}

// One process, the whole batch, one SGD step.
std::vector<torch::Tensor> reference_step(Kind kind) {
  torch::manual_seed(100);
  TwoLayers model(has_units(kind));
  const auto batch = global_batch(0, false);
  torch::mse_loss(model.forward(batch.x), batch.y).backward();
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> values;
  for (const auto& p : model.parameters()) values.push_back((p - p.grad() * kLr).detach().clone());
  return values;
}

void expect_reductions_in_flight(Kind kind) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const int port = testing::free_port();
  const std::string dir = testing::temp_dir("inflight");
  ASSERT_TRUE(ranks_succeeded(testing::run_world(kRanks, [&](int r) { rank_body(kind, r, port, dir); }, 120)));
  torch::Tensor seen;
  torch::load(seen, dir + "/in_flight.pt");
  const auto launched = seen[0].item<int64_t>(), completed = seen[1].item<int64_t>(), slots = seen[2].item<int64_t>();
  EXPECT_GE(slots, kind == Kind::zero3 ? 1 : 2) << "the test needs several reductions to say anything about order";
  EXPECT_EQ(launched, slots) << "every reduction launched during backward";
  EXPECT_EQ(completed, 0) << "backward waited for a reduction";
  std::vector<torch::Tensor> got;
  torch::load(got, dir + "/params.pt");
  size_t index = 0;
  EXPECT_LE(worst_relative_difference(got, reference_step(kind), &index), 1e-6) << "parameter " << index;
}

TEST(ReductionsInFlight, DdpBackwardReturnsBeforeItsBucketsAreReduced) { expect_reductions_in_flight(Kind::ddp); }

TEST(ReductionsInFlight, Zero2BackwardReturnsBeforeItsGroupsAreReduceScattered) {
  expect_reductions_in_flight(Kind::zero2);
}

// The whole model is one group here: with units, zero3 gathers each unit again during backward, a
// collective rank 0 could not finish while rank 1 holds back.
TEST(ReductionsInFlight, Zero3BackwardReturnsBeforeItsGroupIsReduceScattered) {
  expect_reductions_in_flight(Kind::zero3);
}

// Sharded parameters, one group per unit, kept gathered from forward to backward.
TEST(ReductionsInFlight, FsdpShardGradOpBackwardReturnsBeforeItsUnitsAreReduceScattered) {
  expect_reductions_in_flight(Kind::fsdp_shard_grad_op);
}

}  // namespace
}  // namespace ptrain::strategies
