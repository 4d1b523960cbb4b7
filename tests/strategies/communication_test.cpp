// How gradients travel: DDP's gradient compression (--reduce-dtype, PyTorch's bf16/fp16_compress_hook),
// bfloat16 over gloo (which sums no bfloat16), FSDP's reduce dtype over gloo, and --no-overlap-comm.
#include <gtest/gtest.h>

#include "sharded_harness.h"

namespace ptrain::strategies {
namespace {

// The parity Mlp without its unused layer: every bucket fills during backward, so overlap can show.
class Chain : public models::Model {
 public:
  Chain() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  torch::Tensor forward(torch::Tensor x) override { return fc2(torch::tanh(fc1(x))); }
  std::string name() const override { return "chain"; }
  std::shared_ptr<Model> make_replica() const override { return std::make_shared<Chain>(); }
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> units() override { return {}; }
  torch::Tensor forward_unit(size_t, torch::Tensor x) override { return forward(x); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

constexpr int kWorld = 2;
constexpr int64_t kLocal = kGlobalBatch / kWorld;

torch::Tensor rank_rows(const torch::Tensor& t, int rank) { return t.narrow(0, rank * kLocal, kLocal); }

// One backward of Chain (rank 0's weights, in `dtype`) on this rank's rows under DDP; saves the reduced
// gradients in float32 and, last, how many buckets had started their all-reduce before finish_backward.
void ddp_rank(int rank, int port, const std::string& dir, DdpOptions options, torch::ScalarType dtype) {
  torch::set_num_threads(1);
  auto group = std::make_shared<distributed::ProcessGroup>(testing::loopback(rank, kWorld, port), "gloo", 20s);
  torch::manual_seed(100 + rank);
  auto model = std::make_shared<Chain>();
  model->to(dtype);
  DistributedDataParallel ddp(group, torch::kCPU, options);
  ddp.prepare(*model);
  const auto batch = global_batch(0, false);
  const auto out = ddp.forward(*model, rank_rows(batch.x, rank).to(dtype)).to(torch::kFloat);
  torch::mse_loss(out, rank_rows(batch.y, rank)).backward();
  const auto started = static_cast<int64_t>(ddp.reductions_started());
  ddp.finish_backward();
  std::vector<torch::Tensor> saved;
  for (const auto& p : model->parameters()) saved.push_back(p.grad().to(torch::kFloat).clone());
  saved.push_back(torch::tensor(started));
  torch::save(saved, dir + "/ddp" + std::to_string(rank) + ".pt");
}

std::vector<torch::Tensor> run_ddp(DdpOptions options, torch::ScalarType dtype = torch::kFloat) {
  const int port = testing::free_port();
  const std::string dir = testing::temp_dir("comm");
  std::vector<torch::Tensor> rank0;
  if (!ranks_succeeded(testing::run_world(kWorld, [&](int r) { ddp_rank(r, port, dir, options, dtype); }, 60))) return rank0;
  std::vector<torch::Tensor> rank1;
  torch::load(rank0, dir + "/ddp0.pt");
  torch::load(rank1, dir + "/ddp1.pt");
  for (size_t i = 0; i + 1 < rank0.size(); ++i) EXPECT_TRUE(torch::equal(rank0[i], rank1[i])) << "ranks disagree on " << i;
  return rank0;
}

// Each rank's own gradient of its rows (rank 0's weights), replayed here after the ranks are done.
std::vector<std::vector<torch::Tensor>> local_gradients(torch::ScalarType dtype) {
  torch::set_num_threads(1);
  std::vector<std::vector<torch::Tensor>> per_rank;
  for (int r = 0; r < kWorld; ++r) {
    torch::manual_seed(100);
    Chain model;
    model.to(dtype);
    const auto batch = global_batch(0, false);
    torch::mse_loss(model.forward(rank_rows(batch.x, r).to(dtype)).to(torch::kFloat), rank_rows(batch.y, r)).backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : model.parameters()) grads.push_back(p.grad().clone());
    per_rank.push_back(grads);
  }
  return per_rank;
}

// PyTorch's bf16_compress_hook / fp16_compress_hook: cast to the half type, divide by the world size there,
// sum, cast back. gloo sums two half values exactly as a float sum rounded once.
void expect_compression_as_pytorchs_hook(torch::ScalarType half) {
  DdpOptions options;
  options.reduce_dtype = half;
  const auto got = run_ddp(options);
  ASSERT_FALSE(got.empty());
  const auto local = local_gradients(torch::kFloat);
  int64_t differs_from_fp32 = 0;
  for (size_t i = 0; i < local[0].size(); ++i) {
    const auto compressed = [&](int r) { return local[r][i].to(half).div(kWorld).to(torch::kFloat); };
    const auto expected = (compressed(0) + compressed(1)).to(half).to(torch::kFloat);
    EXPECT_TRUE(torch::equal(got[i], expected)) << "parameter " << i << "\n" << got[i] - expected;
    differs_from_fp32 += (got[i] != (local[0][i] + local[1][i]) / kWorld).sum().item<int64_t>();
  }
  EXPECT_GT(differs_from_fp32, 10) << "the gradients were not compressed";
}

TEST(DdpCommunication, Bf16CompressionIsPyTorchsBf16CompressHookOverGloo) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  expect_compression_as_pytorchs_hook(torch::kBFloat16);
}

TEST(DdpCommunication, Fp16CompressionIsPyTorchsFp16CompressHook) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  expect_compression_as_pytorchs_hook(torch::kHalf);
}

// gloo moves no bfloat16: prepare's broadcast and the buckets' sums must go around it.
TEST(DdpCommunication, Bf16ParametersTrainOverGloo) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const auto got = run_ddp({}, torch::kBFloat16);
  ASSERT_FALSE(got.empty());
  const auto local = local_gradients(torch::kBFloat16);
  for (size_t i = 0; i < local[0].size(); ++i) {
    const auto half = [&](int r) { return local[r][i].div(kWorld).to(torch::kFloat); };
    EXPECT_TRUE(torch::equal(got[i], (half(0) + half(1)).to(torch::kBFloat16).to(torch::kFloat))) << "parameter " << i;
  }
}

TEST(DdpCommunication, NoOverlapHoldsEveryReductionUntilBackwardEnds) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  DdpOptions small;
  small.first_bucket_mb = small.bucket_cap_mb = 100.0 / (1 << 20);  // two buckets: fc2's tensors, fc1's
  const auto overlapped = run_ddp(small);
  small.overlap = false;
  const auto held = run_ddp(small);
  ASSERT_FALSE(overlapped.empty());
  ASSERT_FALSE(held.empty());
  EXPECT_EQ(overlapped.back().item<int64_t>(), 2) << "every bucket starts during backward";
  EXPECT_EQ(held.back().item<int64_t>(), 0);
  for (size_t i = 0; i + 1 < held.size(); ++i) EXPECT_TRUE(torch::equal(held[i], overlapped[i])) << i;
}

// Gradients live in their buckets (gradient_as_bucket_view): after a step each parameter's .grad is a view of its
// bucket, the members of a bucket back to back in bucket order; the next step, after the optimizer reset them,
// accumulates into the same memory from zero; a gradient someone set to a tensor of its own gets the average copied
// into it. Rank 0 saves: per step the gradients, then whether each check held.
void bucket_view_rank(int rank, int port, const std::string& dir) {
  torch::set_num_threads(1);
  auto group = std::make_shared<distributed::ProcessGroup>(testing::loopback(rank, kWorld, port), "gloo", 20s);
  torch::manual_seed(100 + rank);
  auto model = std::make_shared<Chain>();
  DdpOptions options;
  options.first_bucket_mb = options.bucket_cap_mb = 100.0 / (1 << 20);  // two buckets: fc2's tensors, fc1's
  DistributedDataParallel ddp(group, torch::kCPU, options);
  ddp.prepare(*model);
  const auto params = model->parameters();
  const auto batch = global_batch(0, false);
  size_t held_in_backward = 0;
  const auto step = [&] {
    torch::mse_loss(ddp.forward(*model, rank_rows(batch.x, rank)), rank_rows(batch.y, rank)).backward();
    held_in_backward = ddp.buckets_held();
    ddp.finish_backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : params) grads.push_back(p.grad());
    return grads;
  };
  const auto reset = [&] {
    for (auto p : params) p.mutable_grad().reset();
  };
  std::vector<torch::Tensor> saved;
  auto first = step();
  std::vector<const void*> where;
  for (const auto& g : first) where.push_back(g.data_ptr());
  bool back_to_back = true;
  for (const auto& bucket : ddp.bucket_layout()) {
    for (size_t k = 1; k < bucket.size(); ++k) {
      const auto& before = first[bucket[k - 1]];
      back_to_back = back_to_back && static_cast<const char*>(where[bucket[k]]) ==
                                         static_cast<const char*>(where[bucket[k - 1]]) + before.numel() * before.element_size();
    }
  }
  for (const auto& g : first) saved.push_back(g.clone());
  // Held from backward to the end of the reduction; after it the buckets live only in the gradients.
  const bool held_then_let_go = held_in_backward == ddp.bucket_layout().size() && ddp.buckets_held() == 0;
  first.clear();
  reset();
  const auto second = step();
  for (size_t i = 0; i < second.size(); ++i) saved.push_back(second[i].clone());
  reset();
  // A gradient set to a tensor of its own is copied into its bucket and replaced by its view there, as PyTorch's
  // gradient_as_bucket_view does.
  auto own = torch::zeros_like(params[0]);
  torch::Tensor(params[0]).mutable_grad() = own;
  const auto third = step();
  saved.push_back(third[0].clone());
  bool in_buckets = true;
  for (const auto& bucket : ddp.bucket_layout()) {
    for (const size_t i : bucket) in_buckets = in_buckets && third[i].storage().is_alias_of(third[bucket.front()].storage());
  }
  saved.push_back(torch::tensor({back_to_back, held_then_let_go, third[0].data_ptr() != own.data_ptr() && in_buckets}));
  if (rank == 0) torch::save(saved, dir + "/views.pt");
}

TEST(DdpCommunication, GradientsAreViewsOfTheirBuckets) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const int port = testing::free_port();
  const std::string dir = testing::temp_dir("views");
  ASSERT_TRUE(ranks_succeeded(testing::run_world(kWorld, [&](int r) { bucket_view_rank(r, port, dir); }, 60)));
  std::vector<torch::Tensor> saved;
  torch::load(saved, dir + "/views.pt");
  const size_t n = 4;  // fc1 and fc2, weight and bias
  ASSERT_EQ(saved.size(), 2 * n + 2);
  const auto checks = saved.back();
  EXPECT_TRUE(checks[0].item<bool>()) << "a bucket's gradients are not back to back in it";
  EXPECT_TRUE(checks[1].item<bool>()) << "ddp held its buckets outside backward and the reduction";
  EXPECT_TRUE(checks[2].item<bool>()) << "a gradient of its own was not moved into its bucket";
  const auto local = local_gradients(torch::kFloat);
  for (size_t i = 0; i < n; ++i) {
    const auto average = (local[0][i] + local[1][i]) / kWorld;
    EXPECT_TRUE(torch::allclose(saved[i], average, 1e-6, 1e-7)) << "step 1, parameter " << i;
    EXPECT_TRUE(torch::equal(saved[n + i], saved[i])) << "step 2 accumulated onto step 1, parameter " << i;
  }
  EXPECT_TRUE(torch::equal(saved[2 * n], saved[0])) << "the average did not reach a gradient of its own";
}

void zero_rank(int rank, int port, const std::string& dir, bool overlap) {
  auto group = std::make_shared<distributed::ProcessGroup>(testing::loopback(rank, kWorld, port), "gloo", 20s);
  torch::manual_seed(100);
  auto model = std::make_shared<Chain>();
  ZeroOptions options;
  options.reduce_bucket_mb = 100.0 / (1 << 20);
  options.overlap_comm = overlap;
  Zero zero(group, torch::kCPU, StrategySpec(StrategyKind::zero2), options);
  zero.prepare(*model);
  auto target = zero.update_target(*model, false);
  const auto batch = global_batch(0, false);
  torch::mse_loss(zero.forward(*model, rank_rows(batch.x, rank)), rank_rows(batch.y, rank)).backward();
  const auto started = static_cast<int64_t>(zero.groups_reduced());
  zero.finish_backward();
  target->gradients_ready();
  std::vector<torch::Tensor> saved;
  for (const auto& p : target->params()) saved.push_back(p.grad().clone());
  saved.push_back(torch::tensor(started));
  torch::save(saved, dir + "/zero" + std::to_string(rank) + ".pt");
}

TEST(ZeroCommunication, NoOverlapHoldsEveryReductionUntilBackwardEnds) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  std::vector<torch::Tensor> results[2];
  for (const bool overlap : {true, false}) {
    const int port = testing::free_port();
    const std::string dir = testing::temp_dir("zerocomm");
    ASSERT_TRUE(ranks_succeeded(testing::run_world(kWorld, [&](int r) { zero_rank(r, port, dir, overlap); }, 60)));
    torch::load(results[overlap ? 0 : 1], dir + "/zero0.pt");
  }
  EXPECT_GT(results[0].back().item<int64_t>(), 0);
  EXPECT_EQ(results[1].back().item<int64_t>(), 0);
  for (size_t i = 0; i + 1 < results[0].size(); ++i) EXPECT_TRUE(torch::equal(results[0][i], results[1][i])) << i;
}

// FSDP's reduce_dtype bf16 over gloo: the gradients are summed as bfloat16 (in float32, rounded once: for
// two ranks a bfloat16 sum exactly), not silently in float32. One SGD step against a reference that rounds
// that way, and against the float32 one it must not match.
TEST(FsdpCommunication, ReduceDtypeBf16OverGlooSumsInBf16) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  ZeroSetup s = with("fsdp");
  s.fsdp.reduce_dtype = torch::kBFloat16;
  const int port = testing::free_port();
  const std::string dir = testing::temp_dir("fsdpbf16");
  ASSERT_TRUE(ranks_succeeded(testing::run_world(kWorld, [&](int r) { train_rank(s, r, kWorld, port, dir, 0, 1); }, 60)));

  const auto reference = [&](bool bf16) {
    auto model = make_zero_model(s, 100);
    const auto batch = global_batch(0, false);
    std::vector<std::vector<torch::Tensor>> local;
    for (int r = 0; r < kWorld; ++r) {
      model->zero_grad();
      torch::mse_loss(model->forward(rank_rows(batch.x, r)), rank_rows(batch.y, r)).backward();
      std::vector<torch::Tensor> grads;
      for (const auto& p : model->parameters())
        grads.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
      local.push_back(grads);
    }
    auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto part = [&](int r) { return bf16 ? (local[r][i] / kWorld).to(torch::kBFloat16).to(torch::kFloat) : local[r][i] / kWorld; };
      const auto sum = part(0) + part(1);
      params[i].mutable_grad() = bf16 ? sum.to(torch::kBFloat16).to(torch::kFloat) : sum;
    }
    auto optimizer = train::make_optimizer(optimizer_options_of(s), params, names_of(*model));
    optimizer->step(lr_of(s), nullptr);
    return state_of(*model);
  };
  std::vector<torch::Tensor> got;
  torch::load(got, rank_file(dir, "params", 0));
  size_t index = 0;
  EXPECT_LE(worst_relative_difference(got, reference(true), &index), 1e-7) << "parameter " << index;
  EXPECT_GT(worst_relative_difference(got, reference(false), &index), 1e-6) << "summed in float32";
}

}  // namespace
}  // namespace ptrain::strategies
