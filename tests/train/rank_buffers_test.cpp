// Batch-norm statistics under the strategies of several processes: each rank's training forwards update its
// own running statistics, yet after a run every rank holds rank 0's, and the test metrics the run reports are
// the ones its saved weights give.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "multiprocess.h"
#include "ptrain/data/registry.h"
#include "ptrain/models/state_dict.h"
#include "ptrain/models/zoo.h"
#include "ptrain/train/plan.h"
#include "ptrain/train/trainer.h"
#include "remove_tree.h"

namespace {

constexpr const char* kData = "80:3x8x8:4";  // 80 training samples, 16 test
constexpr int64_t kTestSamples = 16;

// 80 samples over two ranks at 8 each: 5 steps, each rank's batch norms updated from its own half.
ptrain::config::TrainConfig two_rank_run(const std::string& strategy, const std::string& weights) {
  ptrain::config::TrainConfig c;
  c.model.name = "resnet20";
  c.model.save_weights = weights;
  c.data.dataset = "synthetic";
  c.data.path = kData;
  c.data.test_limit = kTestSamples;
  c.run.strategy = strategy;
  c.run.batch_size = 8;
  c.run.epochs = 1;
  c.run.device = "cpu";
  c.run.threads = 1;
  c.run.seed = 3;
  c.run.progress = "none";
  c.optim.lr = 0.05;
  c.optim.schedule = "constant";
  c.dist.timeout_seconds = 60;
  return c;
}

// The test metrics of the weights file, computed here in one process on the whole test split.
nlohmann::json metrics_of_weights(const std::string& weights) {
  torch::NoGradGuard no_grad;
  auto model = ptrain::models::make_model({"resnet20", 4, 3, 8});
  ptrain::models::load_weights(*model, weights);
  model->eval();
  ptrain::data::DataSpec spec;
  spec.name = "synthetic";
  spec.path = kData;
  const auto test = ptrain::data::spread_subset(ptrain::data::open_dataset(spec, /*train=*/false, 1), kTestSamples);
  const auto norm = ptrain::data::default_normalization("synthetic");
  auto x = test.images.to(torch::kFloat).div(255.0);
  x = x.sub(torch::tensor(norm.mean).view({-1, 1, 1})).div(torch::tensor(norm.std).view({-1, 1, 1}));
  const auto logits = model->forward(x).to(torch::kDouble);
  const double loss = torch::nn::functional::cross_entropy(
                          logits, test.labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                          .item<double>();
  const double correct = logits.argmax(1).eq(test.labels).sum().item<double>();
  return {{"loss", loss / kTestSamples}, {"accuracy", correct / kTestSamples}};
}

class RankBuffers : public ::testing::TestWithParam<std::string> {};

TEST_P(RankBuffers, EveryRankEndsWithRankZerosStatisticsAndTheReportedMetricsAreTheSavedWeights) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const std::string strategy = GetParam();
  const std::string dir = ptrain::testing::temp_dir("rank_buffers_" + strategy);
  const std::string weights = dir + "/weights.safetensors";
  const int port = ptrain::testing::free_port();
  const auto outcomes = ptrain::testing::run_world(2, [&](int rank) {
    ptrain::testing::set_launch_environment(rank, 2, port);
    auto plan = ptrain::train::make_plan(two_rank_run(strategy, weights));
    std::shared_ptr<ptrain::models::Model> model;
    plan.make_model = [&](const ptrain::models::ModelSpec& spec) { return model = ptrain::models::make_model(spec); };
    const auto record = ptrain::train::train(plan, "test");
    std::vector<torch::Tensor> buffers;
    for (const auto& b : model->buffers()) buffers.push_back(b.clone());
    torch::save(buffers, dir + "/buffers" + std::to_string(rank) + ".pt");
    if (rank == 0)
      std::ofstream(dir + "/reported.json") << nlohmann::json{{"loss", *record.epochs_detail.back().test_loss},
                                                              {"accuracy", *record.epochs_detail.back().test_accuracy}}
                                                   .dump();
  }, 180);
  for (const auto& o : outcomes) ASSERT_EQ(o.exit_code, 0) << o.message;
  // The comparison in a process of its own: the parent does no LibTorch work (it forks the next test's ranks).
  const auto check = ptrain::testing::run_world(1, [&](int) {
    std::vector<torch::Tensor> zero, one;
    torch::load(zero, dir + "/buffers0.pt");
    torch::load(one, dir + "/buffers1.pt");
    nlohmann::json out = metrics_of_weights(weights);
    int64_t differing = 0;
    for (size_t i = 0; i < zero.size(); ++i) differing += torch::equal(zero[i], one[i]) ? 0 : 1;
    out["buffers"] = zero.size();
    out["differing"] = differing;
    std::ofstream(dir + "/check.json") << out.dump();
  }, 120);
  ASSERT_EQ(check[0].exit_code, 0) << check[0].message;
  const auto reported = nlohmann::json::parse(std::ifstream(dir + "/reported.json"));
  const auto checked = nlohmann::json::parse(std::ifstream(dir + "/check.json"));
  EXPECT_GT(checked["buffers"].get<int64_t>(), 0);
  EXPECT_EQ(checked["differing"].get<int64_t>(), 0) << "of " << checked["buffers"] << " buffers";
  const double loss = checked["loss"].get<double>();
  EXPECT_NEAR(reported["loss"].get<double>(), loss, 1e-5 * loss) << strategy;
  EXPECT_DOUBLE_EQ(reported["accuracy"].get<double>(), checked["accuracy"].get<double>()) << strategy;
  ptrain::testing::remove_tree(dir);
}

INSTANTIATE_TEST_SUITE_P(Strategies, RankBuffers, ::testing::Values("ddp", "zero2", "zero3", "fsdp"));

}  // namespace
