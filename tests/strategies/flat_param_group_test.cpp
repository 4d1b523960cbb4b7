// The flat parameter group alone, on two gloo ranks: the initial split, gather, release, reduce and the
// all-gather after a step, each against numbers worked out by hand from a 7-element layout (shards of
// 4, the last padded); and the policy each strategy's spec answers.
#include <gtest/gtest.h>

#include <chrono>
#include <sstream>

#include "multiprocess.h"
#include "ptrain/core/error.h"
#include "ptrain/strategies/flat_param_group.h"

namespace ptrain::strategies {
namespace {

using namespace std::chrono_literals;

std::string values_of(const torch::Tensor& t) {
  std::ostringstream out;
  const auto flat = t.detach().to(torch::kFloat).reshape({-1});
  for (int64_t i = 0; i < flat.numel(); ++i) out << (i ? " " : "") << flat[i].item<float>();
  return out.str();
}

// Throws (the rank's failure, reported by run_world) unless t holds exactly `expected`.
void expect_values(const torch::Tensor& t, const std::vector<float>& expected, const std::string& what, int rank) {
  const auto want = torch::tensor(expected);
  if (!t.defined() || t.numel() != want.numel() || !torch::equal(t.detach().to(torch::kFloat).reshape({-1}), want))
    throw std::runtime_error("rank " + std::to_string(rank) + ": " + what + " holds [" +
                             (t.defined() ? values_of(t) : "undefined") + "], expected [" + values_of(want) + "]");
}

void expect_true(bool ok, const std::string& what, int rank) {
  if (!ok) throw std::runtime_error("rank " + std::to_string(rank) + ": " + what);
}

// a = [1 2 3] and b = [[4 5] [6 7]], plus 10 on rank 1, so that each gathered element shows whose shard
// it came from.
std::vector<torch::Tensor> rank_params(int rank) {
  const float plus = 10.0f * static_cast<float>(rank);
  return {(torch::tensor({1.0f, 2.0f, 3.0f}) + plus).requires_grad_(),
          (torch::tensor({4.0f, 5.0f, 6.0f, 7.0f}).reshape({2, 2}) + plus).requires_grad_()};
}

// Gradients (rank + 1) * [1 .. 7]: their average over two ranks is 1.5 * [1 .. 7].
void set_grads(std::vector<torch::Tensor>& params, int rank) {
  const float times = static_cast<float>(rank + 1);
  params[0].mutable_grad() = torch::tensor({1.0f, 2.0f, 3.0f}) * times;
  params[1].mutable_grad() = torch::tensor({4.0f, 5.0f, 6.0f, 7.0f}).reshape({2, 2}) * times;
}

// The group as the only slot of a gradient reducer, reduced at once.
void reduce_alone(FlatParamGroup& group, std::optional<torch::ScalarType> reduce_dtype) {
  GradientReducer reducer({reduce_dtype, true}, distributed::make_comm_streams(torch::kCPU));
  reducer.add_slot(group.reduction());
  reducer.mark_ready(0);
  reducer.finish();
}

void run_two_ranks(const std::function<void(int, const ShardMesh&)>& body) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const int port = testing::free_port();
  const auto outcomes = testing::run_world(
      2,
      [&](int rank) {
        auto group = std::make_shared<distributed::ProcessGroup>(testing::loopback(rank, 2, port), "gloo", 20s);
        body(rank, ShardMesh::of(group, 0, "test"));
      },
      60);
  for (size_t r = 0; r < outcomes.size(); ++r) EXPECT_EQ(outcomes[r].exit_code, 0) << outcomes[r].message;
}

TEST(FlatParamGroup, ShardedParametersAreSplitGatheredReleasedAndTheirGradientsReduceScattered) {
  run_two_ranks([](int rank, const ShardMesh& mesh) {
    auto params = rank_params(rank);
    const auto policy = ShardingPolicy::of(StrategySpec(StrategyKind::zero3));
    FlatParamGroup group(params, {"a", "b"}, policy, mesh, torch::kCPU, torch::kCPU, distributed::make_comm_streams(torch::kCPU));
    // The initial split keeps this rank's 4 of the 8 padded elements and frees the buffer.
    expect_true(!group.gathered(), "the buffer is freed after the split", rank);
    expect_values(group.param_shard(), rank == 0 ? std::vector<float>{1, 2, 3, 4} : std::vector<float>{15, 16, 17, 0},
                  "param_shard", rank);
    expect_true(group.param_bytes() == 4 * 4 && group.grad_bytes() == 4 * 4, "shard bytes", rank);
    expect_true(group.shard_index() == rank && group.shard_count() == 2, "shard index and count", rank);
    // Gather: rank 0's shard then rank 1's, into the parameters themselves.
    group.gather();
    expect_values(params[0], {1, 2, 3}, "a after gather", rank);
    expect_values(params[1], {4, 15, 16, 17}, "b after gather", rank);
    group.release();
    expect_true(!group.gathered(), "release frees the buffer", rank);
    group.start_gather();
    group.gather();
    expect_values(params[1], {4, 15, 16, 17}, "b after a second gather", rank);
    // Reduce: the average, scattered; the parameters' gradients are handed over.
    set_grads(params, rank);
    reduce_alone(group, std::nullopt);
    expect_values(group.grad_shard(), rank == 0 ? std::vector<float>{1.5, 3, 4.5, 6} : std::vector<float>{7.5, 9, 10.5, 0},
                  "grad_shard", rank);
    expect_true(!params[0].grad().defined() && !params[1].grad().defined(), "reduce clears .grad()", rank);
    // Every rank's shard back as whole parameters, e.g. for a checkpoint.
    const auto parts = group.gather_split(group.grad_shard());
    expect_values(parts[0], {1.5, 3, 4.5}, "gathered gradient of a", rank);
    expect_values(parts[1], {6, 7.5, 9, 10.5}, "gathered gradient of b", rank);
  });
}

TEST(FlatParamGroup, ReplicatedParametersAreAllReducedAndGatheredAfterTheStep) {
  run_two_ranks([](int rank, const ShardMesh& mesh) {
    auto params = rank_params(rank);
    const auto policy = ShardingPolicy::of(StrategySpec(StrategyKind::zero1));
    FlatParamGroup group(params, {"a", "b"}, policy, mesh, torch::kCPU, torch::kCPU, distributed::make_comm_streams(torch::kCPU));
    expect_true(group.gathered(), "replicated parameters stay whole", rank);
    group.release();
    expect_true(group.gathered(), "release leaves replicated parameters alone", rank);
    expect_true(group.grad_bytes() == 8 * 4, "zero1 keeps the whole flat gradients", rank);
    set_grads(params, rank);
    reduce_alone(group, std::nullopt);
    expect_values(group.grad_shard(), rank == 0 ? std::vector<float>{1.5, 3, 4.5, 6} : std::vector<float>{7.5, 9, 10.5, 0},
                  "this rank's slice of the all-reduced gradients", rank);
    // A step on this rank's shard only, then every rank's updated shard into every rank's parameters.
    {
      torch::NoGradGuard no_grad;
      group.param_shard().add_(100.0f * static_cast<float>(rank + 1));
    }
    group.gather_updated_parameters();
    expect_values(params[0], {101, 102, 103}, "a after the all-gather", rank);
    expect_values(params[1], {104, 215, 216, 217}, "b after the all-gather", rank);
  });
}

TEST(FlatParamGroup, NoShardKeepsOneShardOfEverythingAndSumsInTheReduceDtype) {
  run_two_ranks([](int rank, const ShardMesh& mesh) {
    auto params = rank_params(rank);
    const auto policy = ShardingPolicy::of(StrategySpec(StrategyKind::fsdp, FsdpSharding::no_shard));
    FlatParamGroup group(params, {"a", "b"}, policy, mesh, torch::kCPU, torch::kCPU, distributed::make_comm_streams(torch::kCPU));
    expect_true(group.shard_index() == 0 && group.shard_count() == 1, "one shard", rank);
    set_grads(params, rank);
    // float16 holds 1.5 * [1 .. 7] exactly; the sum comes back in the parameters' float32.
    reduce_alone(group, torch::kHalf);
    expect_true(group.grad_shard().scalar_type() == torch::kFloat, "gradients back in float32", rank);
    expect_values(group.grad_shard(), {1.5, 3, 4.5, 6, 7.5, 9, 10.5}, "the whole averaged gradients", rank);
  });
}

// Gradients in every layout reach the reduction in their parameters' places: contiguous and channels-last ones, one
// of other strides than its parameter's, and a missing one as zeros.
TEST(FlatParamGroup, GradientsOfEveryLayoutAreTakenIntoTheirPlaces) {
  run_two_ranks([](int rank, const ShardMesh& mesh) {
    const auto values = [](int64_t n, float from) { return torch::arange(from, from + static_cast<float>(n)); };
    std::vector<torch::Tensor> params{
        values(3, 1).requires_grad_(),                                                   // a: contiguous
        values(6, 4).reshape({2, 3}).requires_grad_(),                                    // b: contiguous
        values(8, 10).reshape({1, 2, 2, 2}).contiguous(torch::MemoryFormat::ChannelsLast).requires_grad_(),  // c
        values(4, 18).reshape({2, 2}).requires_grad_(),                                   // d: gets a transposed gradient
        values(2, 22).requires_grad_(),                                                   // e: gets none
        values(3, 24).requires_grad_()};                                                  // f: contiguous
    const auto policy = ShardingPolicy::of(StrategySpec(StrategyKind::zero2));
    FlatParamGroup group(params, {"a", "b", "c", "d", "e", "f"}, policy, mesh, torch::kCPU, torch::kCPU,
                         distributed::make_comm_streams(torch::kCPU));
    expect_true(params[2].is_contiguous(torch::MemoryFormat::ChannelsLast), "c stays channels-last", rank);
    const float times = static_cast<float>(rank + 1);
    std::vector<torch::Tensor> wanted;  // the average over both ranks: 1.5 times rank 0's
    for (size_t i = 0; i < params.size(); ++i) {
      const auto grad = (-params[i].detach() * 2 + 0.5).contiguous(params[i].suggest_memory_format());
      wanted.push_back((i == 4 ? torch::zeros_like(grad) : grad * 1.5).contiguous());  // in logical order
      if (i == 4) continue;
      params[i].mutable_grad() = i == 3 ? (grad * times).t().contiguous().t() : grad * times;
    }
    expect_true(!params[3].grad().is_contiguous(), "d's gradient has other strides than d", rank);
    reduce_alone(group, std::nullopt);
    const auto parts = group.gather_split(group.grad_shard());
    for (size_t i = 0; i < params.size(); ++i) {
      expect_values(parts[i], std::vector<float>(wanted[i].data_ptr<float>(), wanted[i].data_ptr<float>() + wanted[i].numel()),
                    std::string("the averaged gradient of ") + group.names()[i], rank);
      expect_true(!params[i].grad().defined(), "reduce clears .grad()", rank);
    }
  });
}

TEST(ShardingPolicy, EachStrategyAnswersWhatItShardsAndWhenItReleases) {
  const auto zero1 = ShardingPolicy::of(StrategySpec(StrategyKind::zero1));
  EXPECT_TRUE(zero1.shards_optimizer_state && !zero1.shards_gradients && !zero1.shards_parameters);
  EXPECT_TRUE(zero1.gathers_after_step() && !zero1.groups_by_units());
  const auto zero2 = ShardingPolicy::of(StrategySpec(StrategyKind::zero2));
  EXPECT_TRUE(zero2.shards_gradients && !zero2.shards_parameters && zero2.gathers_after_step());
  const auto zero3 = ShardingPolicy::of(StrategySpec(StrategyKind::zero3));
  EXPECT_TRUE(zero3.shards_parameters && zero3.reshards_after_forward && zero3.groups_by_units());
  EXPECT_FALSE(zero3.gathers_after_step() || zero3.hybrid);
  const auto grad_op = ShardingPolicy::of(StrategySpec(StrategyKind::fsdp, FsdpSharding::shard_grad_op));
  EXPECT_TRUE(grad_op.shards_parameters && !grad_op.reshards_after_forward);
  const auto no_shard = ShardingPolicy::of(StrategySpec(StrategyKind::fsdp, FsdpSharding::no_shard));
  EXPECT_FALSE(no_shard.shards_optimizer_state || no_shard.shards_gradients || no_shard.gathers_after_step());
  const auto hybrid = ShardingPolicy::of(StrategySpec(StrategyKind::fsdp, FsdpSharding::hybrid_shard_zero2));
  EXPECT_TRUE(hybrid.hybrid && hybrid.shards_parameters && !hybrid.reshards_after_forward);
  EXPECT_THROW(ShardingPolicy::of(StrategySpec(StrategyKind::ddp)), Error);
}

}  // namespace
}  // namespace ptrain::strategies

namespace ptrain::strategies {
namespace {

// A model's buffers become views of one flat buffer per dtype, keeping their values and the tensor objects the
// modules hold: batch norm's in-place running statistics land in the flat buffer, and what is written into the
// flat buffer (a broadcast) lands in the module.
TEST(FlattenInPlace, BuffersBecomeViewsOfOneFlatBufferPerDtype) {
  torch::manual_seed(7);
  torch::nn::Module model;
  auto three = model.register_module("three", torch::nn::BatchNorm2d(3));
  auto five = model.register_module("five", torch::nn::BatchNorm2d(5));
  model.train();
  three->forward(torch::randn({4, 3, 2, 2}));
  auto buffers = model.buffers();
  ASSERT_EQ(buffers.size(), 6u);  // running_mean, running_var, num_batches_tracked, twice
  std::vector<torch::Tensor> before;
  std::vector<const c10::TensorImpl*> objects;
  for (const auto& b : buffers) {
    before.push_back(b.clone());
    objects.push_back(b.unsafeGetTensorImpl());
  }
  const auto flats = flatten_in_place(buffers);
  ASSERT_EQ(flats.size(), 2u);  // float32 statistics, int64 counters
  EXPECT_EQ(flats[0].numel(), 3 + 3 + 5 + 5);
  EXPECT_EQ(flats[1].numel(), 2);
  const auto after = model.buffers();
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].unsafeGetTensorImpl(), objects[i]) << i;
    EXPECT_TRUE(torch::equal(after[i], before[i])) << i;
  }
  three->forward(torch::randn({4, 3, 2, 2}));
  EXPECT_FALSE(torch::equal(flats[0].narrow(0, 0, 3), before[0])) << "the running mean's update missed the flat buffer";
  EXPECT_EQ(flats[1][0].item<int64_t>(), before[2].item<int64_t>() + 1);
  flats[0].fill_(0.5);
  EXPECT_TRUE(torch::equal(five->running_mean, torch::full({5}, 0.5)));
}

}  // namespace
}  // namespace ptrain::strategies
