// A model outside the zoo, scripted by PyTorch (tests/oracles/torchscript_model.py), trained by ptrain's
// trainer from the archive's initial state on the same images, with the same sampler, as PyTorch trains
// the same archive: the loss of every step agrees within 1e-4 relative, on one process and on two over
// gloo under ddp and zero3 (every block of the forward chain its own sharded unit), and the weights ptrain
// exports (--save-weights .pt, and .safetensors gathered from zero3's shards) load into PyTorch, scripted
// and eager, giving the eval logits PyTorch's own training gives.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "multiprocess.h"
#include "ptrain/train/plan.h"
#include "ptrain/train/trainer.h"
#include "test_support.h"

namespace ptrain::train {
namespace {

constexpr int kSteps = 4;
constexpr int kBatch = 8;  // per rank
constexpr double kLr = 0.05;
constexpr uint64_t kSeed = 3;

std::string fixture(const std::string& name) { return std::string(PTRAIN_TORCHSCRIPT_FIXTURES) + "/" + name; }

config::TrainConfig scripted_run(const std::string& strategy) {
  config::TrainConfig c;
  c.model.name = fixture("net.pt");
  c.data.dataset = "imagefolder";
  c.data.path = fixture("data");
  c.data.augment = false;
  c.data.loader_threads = 1;
  c.run.strategy = strategy;
  c.run.batch_size = kBatch;
  c.run.epochs = 1;
  c.run.max_steps = kSteps;
  c.run.device = "cpu";
  c.run.seed = kSeed;
  c.run.threads = 1;
  c.run.progress = "none";
  c.optim.name = "sgd";
  c.optim.lr = kLr;
  c.optim.momentum = 0.9;
  c.optim.weight_decay = 0.0;
  c.optim.schedule = "constant";
  return c;
}

// Trains in this process (rank `rank` of `world` when world > 1) and writes the step losses, one a line.
void train_and_record(config::TrainConfig c, int rank, int world, int port, const std::string& losses_file) {
  if (world > 1) {
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  }
  const Plan plan = make_plan(c);
  std::ofstream out(losses_file);
  out.precision(17);
  TrainHooks hooks;
  hooks.on_step = [&](const StepReport& r) { out << r.loss << "\n"; };
  train(plan, "torchscript parity test", hooks);
}

std::vector<double> read_losses(const std::string& path) {
  std::ifstream in(path);
  std::vector<double> losses;
  double v = 0;
  while (in >> v) losses.push_back(v);
  return losses;
}

nlohmann::json oracle(const std::string& args, const std::string& out) {
  const auto r = testing::run_oracle("torchscript_model.py", args + " " + out);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(out);
  return nlohmann::json::parse(in);
}

double relative_gap(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j) {
      diff += (a[i][j] - b[i][j]) * (a[i][j] - b[i][j]);
      norm += b[i][j] * b[i][j];
    }
  return std::sqrt(diff / norm);
}

// PyTorch's losses for `world` ranks against ptrain's, and, when weights were exported, PyTorch's eval
// logits from them against those of its own training.
void expect_parity(int world, const std::string& dir, const std::string& weights) {
  const auto expected = oracle("train " + fixture("") + " " + std::to_string(world) + " " + std::to_string(kBatch) +
                                   " " + std::to_string(kSteps) + " " + std::to_string(kLr) + " " + std::to_string(kSeed),
                               dir + "/expected.json");
  for (int rank = 0; rank < world; ++rank) {
    const auto ours = read_losses(dir + "/losses" + std::to_string(rank) + ".txt");
    ASSERT_EQ(ours.size(), static_cast<size_t>(kSteps)) << "rank " << rank;
    for (int step = 0; step < kSteps; ++step) {
      const double theirs = expected["losses"][step][rank].get<double>();
      EXPECT_NEAR(ours[step], theirs, 1e-4 * std::abs(theirs)) << "rank " << rank << ", step " << step + 1;
    }
  }
  if (weights.empty()) return;
  const auto loaded = oracle("check " + fixture("") + " " + weights, dir + "/loaded.json");
  const auto reference = expected["eval_logits"].get<std::vector<std::vector<double>>>();
  for (const char* side : {"scripted", "eager"}) {
    const auto logits = loaded[side].get<std::vector<std::vector<double>>>();
    ASSERT_EQ(logits.size(), reference.size()) << side;
    EXPECT_LE(relative_gap(logits, reference), 1e-4) << side;
  }
  EXPECT_EQ(loaded["keys"], loaded["expected_keys"]);
}

TEST(TorchScriptTraining, OneProcessMatchesPyTorchStepByStepAndExportsATorchLoadableStateDict) {
  const testing::TempDir dir;
  auto c = scripted_run("single");
  c.model.save_weights = dir.file("trained.pt");
  train_and_record(c, 0, 1, 0, dir.file("losses0.txt"));
  expect_parity(1, dir.path(), dir.file("trained.pt"));
}

void expect_two_rank_parity(const std::string& strategy, const std::string& weights_name) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const testing::TempDir dir;
  const int port = testing::free_port();
  auto c = scripted_run(strategy);
  if (!weights_name.empty()) c.model.save_weights = dir.file(weights_name);
  const auto outcomes = testing::run_world(
      2, [&](int rank) { train_and_record(c, rank, 2, port, dir.file("losses" + std::to_string(rank) + ".txt")); }, 120);
  for (size_t r = 0; r < outcomes.size(); ++r)
    ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r << ": " << outcomes[r].message;
  expect_parity(2, dir.path(), weights_name.empty() ? "" : dir.file(weights_name));
}

TEST(TorchScriptTraining, TwoProcessDdpMatchesPyTorch) { expect_two_rank_parity("ddp", ""); }

TEST(TorchScriptTraining, TwoProcessZero3ShardingEveryUnitMatchesPyTorchAndExportsSafetensors) {
  expect_two_rank_parity("zero3", "trained.safetensors");
}

}  // namespace
}  // namespace ptrain::train
