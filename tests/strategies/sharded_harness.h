// The harness the sharded strategies' parity tests share (zero_test.cpp, fsdp_test.cpp): N ranks each
// train on 1/N of a fixed global batch through a strategy's update target, as the trainer's step does;
// one process on the whole batch, through the same optimizer, is the reference.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <set>

#include "multiprocess.h"
#include "parity.h"
#include "ptrain/core/error.h"
#include "ptrain/strategies/ddp.h"
#include "ptrain/strategies/fsdp.h"
#include "ptrain/strategies/zero.h"
#include "ptrain/train/checkpoint.h"
#include "ptrain/train/grad_clip.h"
#include "ptrain/train/optimizer.h"

namespace ptrain::strategies {
namespace {

using namespace std::chrono_literals;
using namespace parity;

// The parity Mlp cut into units, as the zoo's models are: zero3 gathers fc1 and fc2 one at a time; the
// unused layer belongs to no unit.
class UnitMlp : public Mlp {
 public:
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> units() override {
    return {{"fc1", fc1.ptr()}, {"fc2", fc2.ptr()}};
  }
  torch::Tensor forward_unit(size_t index, torch::Tensor x) override {
    return index == 0 ? torch::tanh(fc1(x)) : fc2(x);
  }
  torch::Tensor forward(torch::Tensor x) override { return forward_unit(1, forward_unit(0, x)); }
};

struct ZeroSetup {
  std::string strategy = "zero1";  // zero1..3, fsdp (with `fsdp`), or ddp (checkpoint tests)
  int accumulation = 1;
  double clip = 0;
  bool offload_optimizer = false;
  bool offload_params = false;
  bool units = false;             // UnitMlp instead of Mlp
  bool zoo_resnet = false;        // the zoo's resnet20 (units: stem, blocks, fc) on 4x4 images, with activation checkpointing
  double reduce_bucket_mb = 25;   // small: several flat groups
  std::string optimizer = "sgd";  // sgd with momentum, or adamw
  bool bf16_masters = false;      // pure bfloat16 parameters, the optimizer on fp32 masters
  FsdpOptions fsdp;               // strategy fsdp: its options (offload_params comes from above)
  int local_world_size = 0;       // fsdp hybrid: ranks per node; 0: the world
  bool sharded_checkpoint = false;  // save_to: every rank writes its shards, rank 0 the checkpoint naming them
};

// The ZeRO stage whose arithmetic the run's model state follows: ddp and FSDP's no-shard keep it all.
int stage_of(const ZeroSetup& s) {
  if (s.strategy == "ddp") return 0;
  if (s.strategy == "fsdp") return s.fsdp.sharding == FsdpSharding::no_shard ? 0 : 3;
  return s.strategy.back() - '0';
}

// The ranks one shard layout spans: the world, or a hybrid group.
int shard_ranks_of(const ZeroSetup& s, int world) {
  if (s.strategy != "fsdp" || !StrategySpec(StrategyKind::fsdp, s.fsdp.sharding).hybrid()) return world;
  const int64_t size = s.fsdp.hybrid_group_size > 0 ? s.fsdp.hybrid_group_size : s.local_world_size > 0 ? s.local_world_size : world;
  return static_cast<int>(size);
}

std::shared_ptr<models::Model> make_zero_model(const ZeroSetup& s, int seed) {
  torch::manual_seed(seed);
  if (s.zoo_resnet) {
    auto model = models::make_model({"resnet20", 3, 3, 4});
    model->set_activation_checkpointing(true);
    return model;
  }
  if (s.units) return std::make_shared<UnitMlp>();
  return std::make_shared<Mlp>();
}

train::OptimizerOptions optimizer_options_of(const ZeroSetup& s) {
  train::OptimizerOptions c;
  c.kind = s.optimizer == "adamw" ? train::OptimizerKind::adamw : train::OptimizerKind::sgd;
  c.momentum = 0.9;
  c.weight_decay = 1e-3;
  return c;
}

double lr_of(const ZeroSetup& s) { return s.optimizer == "adamw" ? 0.01 : kLr; }

std::vector<std::string> names_of(models::Model& model) {
  std::vector<std::string> names;
  for (const auto& item : model.named_parameters()) names.push_back(item.key());
  return names;
}

// One process on the whole batch, through the same optimizer: the reference. Returns its parameters;
// optimizer_keys gets the keys of its optimizer state. With rows < kGlobalBatch, only the first rows of
// each batch: what one replica alone would learn.
std::vector<torch::Tensor> train_zero_reference(const ZeroSetup& s, int steps, std::set<std::string>* optimizer_keys = nullptr,
                                                int* clipped_steps = nullptr, int64_t rows = kGlobalBatch) {
  auto model = make_zero_model(s, 100);
  model->train();
  auto optimizer = train::make_optimizer(optimizer_options_of(s), model->parameters(), names_of(*model));
  int clipped = 0;
  for (int step = 0; step < steps; ++step) {
    const auto batch = global_batch(step, false);
    torch::mse_loss(model->forward(batch.x.narrow(0, 0, rows)), batch.y.narrow(0, 0, rows)).backward();
    if (clip(*model, s.clip)) ++clipped;
    // The unused layer gets no gradient; the strategies count it as zero, as DDP does.
    for (auto& p : model->parameters()) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    }
    optimizer->step(lr_of(s), nullptr);
    optimizer->zero_grad();
  }
  if (clipped_steps) *clipped_steps = clipped;
  if (optimizer_keys) {
    for (const auto& [key, tensor] : optimizer->state()) optimizer_keys->insert(key);
  }
  return state_of(*model);
}

std::unique_ptr<Strategy> make_rank_strategy(const ZeroSetup& s, std::shared_ptr<distributed::ProcessGroup> group) {
  if (s.strategy == "ddp") return std::make_unique<DistributedDataParallel>(std::move(group), torch::kCPU);
  if (s.strategy == "fsdp") {
    auto options = s.fsdp;
    options.offload_params = s.offload_params;
    const int64_t local = s.local_world_size > 0 ? s.local_world_size : group->world_size();
    return make_fsdp(std::move(group), torch::kCPU, options, local);
  }
  ZeroOptions options;
  options.offload_optimizer = s.offload_optimizer;
  options.offload_params = s.offload_params;
  options.reduce_bucket_mb = s.reduce_bucket_mb;
  return std::make_unique<Zero>(std::move(group), torch::kCPU, StrategySpec::parse(s.strategy), options);
}

std::string rank_file(const std::string& dir, const std::string& what, int rank) {
  return dir + "/" + what + std::to_string(rank) + ".pt";
}

// Trains steps [first, last) of the parity schedule on one rank, as the trainer's step does: finish
// backward, gradients to the optimizer's tensors, global-norm clipping, step, parameters back. With
// resume_from, starts from that checkpoint; with save_to, rank 0 writes one at the end.
void train_rank(const ZeroSetup& s, int rank, int world, int port, const std::string& dir, int first, int last,
                const std::string& resume_from = "", const std::string& save_to = "") {
  auto group = std::make_shared<distributed::ProcessGroup>(testing::loopback(rank, world, port), "gloo", 20s);
  // Ranks start from different weights: prepare() must copy rank 0's.
  auto model = make_zero_model(s, 100 + rank);
  model->train();
  if (s.bf16_masters) model->to(torch::kBFloat16);
  auto strategy = make_rank_strategy(s, group);
  strategy->prepare(*model);
  auto target = strategy->update_target(*model, /*master_weights=*/s.bf16_masters);
  auto optimizer = train::make_optimizer(optimizer_options_of(s), target->params(), target->names());
  if (!resume_from.empty()) {
    const auto ckpt = train::load_checkpoint(resume_from);
    target->load_full_parameters(ckpt.model, resume_from);
    optimizer->load_state(target->local_optimizer_state(ckpt.optimizer), resume_from);
  }
  const int64_t local = kGlobalBatch / world;
  const int64_t micro = local / s.accumulation;
  for (int step = first; step < last; ++step) {
    const auto batch = global_batch(step, s.zoo_resnet);
    for (int m = 0; m < s.accumulation; ++m) {
      strategy->set_gradient_sync(m == s.accumulation - 1);
      const int64_t begin = rank * local + m * micro;
      auto x = batch.x.narrow(0, begin, micro);
      if (s.bf16_masters) x = x.to(torch::kBFloat16);
      const auto out = strategy->forward(*model, x).to(torch::kFloat);
      (torch::mse_loss(out, batch.y.narrow(0, begin, micro)) / s.accumulation).backward();
    }
    strategy->finish_backward();
    target->gradients_ready();
    std::vector<torch::Tensor> grads;
    for (const auto& p : optimizer->params()) grads.push_back(p.grad());
    if (s.clip > 0) train::clip_grads_to_norm_(grads, target->global_norm(train::global_grad_norm(grads)), s.clip);
    optimizer->step(lr_of(s), nullptr);
    target->parameters_updated();
    optimizer->zero_grad();
  }
  const auto params = target->full_parameters();
  const auto optimizer_state = target->full_optimizer_state(optimizer->state());
  std::vector<torch::Tensor> values;
  for (const auto& [name, tensor] : params) values.push_back(tensor);
  torch::save(values, rank_file(dir, "params", rank));
  const auto bytes = target->model_state_bytes(optimizer->state());
  // What the model's parameters really hold between steps (zero3: nothing, its shards live elsewhere).
  std::set<const void*> storages;
  int64_t resident = 0;
  for (const auto& p : model->parameters()) {
    if (storages.insert(p.storage().unsafeGetStorageImpl()).second) resident += static_cast<int64_t>(p.storage().nbytes());
  }
  torch::save(torch::tensor({bytes.params, bytes.grads, bytes.optimizer, resident}), rank_file(dir, "bytes", rank));
  if (!save_to.empty() && s.sharded_checkpoint) {
    nlohmann::json layout;
    const auto shards = target->local_shards(optimizer->state(), &layout);
    train::save_shard(save_to, rank, world, shards, layout);
    group->barrier().wait();
    if (rank == 0) {
      train::Checkpoint ckpt;
      ckpt.shards = world;
      train::save_checkpoint(save_to, ckpt);
    }
  } else if (!save_to.empty() && rank == 0) {
    train::Checkpoint ckpt;
    ckpt.model = params;
    ckpt.optimizer = optimizer_state;
    train::save_checkpoint(save_to, ckpt);
  }
}

bool ranks_succeeded(const std::vector<testing::RankOutcome>& outcomes) {
  bool ok = true;
  for (size_t r = 0; r < outcomes.size(); ++r) {
    EXPECT_EQ(outcomes[r].exit_code, 0) << "rank " << r << ": " << outcomes[r].message;
    ok = ok && outcomes[r].exit_code == 0;
  }
  return ok;
}

// Every rank's final parameters against the reference; returns the worst relative difference.
double worst_gap(const std::string& dir, int world, const std::vector<torch::Tensor>& reference) {
  double worst = 0;
  for (int r = 0; r < world; ++r) {
    std::vector<torch::Tensor> state;
    torch::load(state, rank_file(dir, "params", r));
    EXPECT_EQ(state.size(), reference.size());
    size_t index = 0;
    const double gap = worst_relative_difference(state, reference, &index);
    if (gap > 1e-5) ADD_FAILURE() << "rank " << r << " parameter " << index << ": " << gap;
    worst = std::max(worst, gap);
  }
  return worst;
}

// Bytes one full copy of the parameters takes (fp32), and the optimizer's slots per parameter.
int64_t parameter_bytes() {
  int64_t n = 0;
  for (const auto& p : Mlp().parameters()) n += p.numel() * 4;
  return n;
}

void expect_zero_arithmetic(const ZeroSetup& s, const std::string& dir, int world) {
  const double full = static_cast<double>(parameter_bytes());
  const double slots = s.optimizer == "adamw" ? 2 : 1;  // exp_avg + exp_avg_sq, or the momentum buffer
  // --offload-optimizer steps a CPU copy of the shard with a gradient copy beside it.
  // (FSDP's parameter offload does the same.)
  const double copies = s.offload_optimizer || (s.strategy == "fsdp" && s.offload_params) ? 2 : 0;
  const int stage = stage_of(s);
  const double shards = shard_ranks_of(s, world);
  const double expected_params = stage >= 3 ? full / shards : full;
  const double expected_grads = stage >= 2 ? full / shards : full;
  const double expected_optimizer = (slots + copies) * full / (stage >= 1 ? shards : 1);
  for (int r = 0; r < world; ++r) {
    torch::Tensor bytes;
    torch::load(bytes, rank_file(dir, "bytes", r));
    const auto b = bytes.to(torch::kDouble);
    EXPECT_NEAR(b[0].item<double>(), expected_params, 0.1 * expected_params) << s.strategy << " rank " << r << " params";
    EXPECT_NEAR(b[1].item<double>(), expected_grads, 0.1 * expected_grads) << s.strategy << " rank " << r << " grads";
    EXPECT_NEAR(b[2].item<double>(), expected_optimizer, 0.1 * expected_optimizer)
        << s.strategy << " rank " << r << " optimizer";
    if (stage == 3) {
      EXPECT_EQ(b[3].item<double>(), 0) << "zero3 rank " << r << ": parameters still hold storage between steps";
    } else {
      EXPECT_NEAR(b[3].item<double>(), full, 0.1 * full) << s.strategy << " rank " << r << " resident parameters";
    }
  }
}

// Trains kSteps at world size `world` and compares with the reference; also checks the bytes.
double zero_parity_gap(const ZeroSetup& s, int world) {
  const int port = testing::free_port();
  const std::string dir = testing::temp_dir("zero");
  if (!ranks_succeeded(testing::run_world(world, [&](int rank) { train_rank(s, rank, world, port, dir, 0, kSteps); }, 90)))
    return 1e300;
  int clipped_steps = 0;
  const auto reference = train_zero_reference(s, kSteps, nullptr, &clipped_steps);
  if (s.clip > 0) { EXPECT_GT(clipped_steps, 0) << "the clip threshold never bit: the test would not check clipping"; }
  expect_zero_arithmetic(s, dir, world);
  return worst_gap(dir, world, reference);
}

[[maybe_unused]] void expect_zero_parity(const ZeroSetup& s, int world) { EXPECT_LE(zero_parity_gap(s, world), 1e-5) << s.strategy; }

[[maybe_unused]] ZeroSetup with(std::string strategy, int accumulation = 1, double clip = 0) {
  ZeroSetup s;
  s.strategy = std::move(strategy);
  s.accumulation = accumulation;
  s.clip = clip;
  return s;
}

constexpr double kSmallBuckets = 300.0 / (1 << 20);  // ~300 bytes: three flat groups of the Mlp

}  // namespace
}  // namespace ptrain::strategies
