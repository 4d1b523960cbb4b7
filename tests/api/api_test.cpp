// The library API on a module of the test's own: ptrain::wrap keeps its parameters and names, fully_shard
// marks units (refusing nested ones), and ptrain::fit trains it under zero3 on two processes, each marked
// block gathered by its own forward, step by step as one process trains on the whole batch.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <fstream>

#include "multiprocess.h"
#include "ptrain/core/error.h"
#include "ptrain/ptrain.h"
#include "remove_tree.h"

namespace {

namespace nn = torch::nn;

struct Block : nn::Module {
  explicit Block(int64_t c) {
    conv = register_module("conv", nn::Conv2d(nn::Conv2dOptions(c, c, 3).padding(1)));
    norm = register_module("norm", nn::GroupNorm(nn::GroupNormOptions(2, c)));
  }
  torch::Tensor forward(torch::Tensor x) { return torch::relu(x + norm(conv(x))); }
  nn::Conv2d conv{nullptr};
  nn::GroupNorm norm{nullptr};
};

struct Net : nn::Module {
  Net() {
    stem = register_module("stem", nn::Conv2d(nn::Conv2dOptions(3, 8, 3).padding(1)));
    block1 = register_module("block1", ptrain::fully_shard(std::make_shared<Block>(8)));
    block2 = register_module("block2", ptrain::fully_shard(std::make_shared<Block>(8)));
    head = register_module("head", nn::Linear(8, 3));
  }
  torch::Tensor forward(torch::Tensor x) {
    // A skip connection around the units: their forward is called from here, in no chain.
    auto h = torch::relu(stem(x));
    return head((block2->forward(block1->forward(h)) + h).mean({2, 3}));
  }
  nn::Conv2d stem{nullptr};
  std::shared_ptr<ptrain::Sharded<Block>> block1, block2;
  nn::Linear head{nullptr};
};

struct Nested : nn::Module {
  Nested() { outer = register_module("outer", ptrain::fully_shard(std::make_shared<Net>())); }
  torch::Tensor forward(torch::Tensor x) { return outer->forward(x); }
  std::shared_ptr<ptrain::Sharded<Net>> outer;
};

ptrain::Data images() {
  torch::manual_seed(5);
  auto x = torch::randint(0, 256, {96, 3, 8, 8}, torch::kInt64).to(torch::kUInt8);
  auto y = torch::randint(0, 3, {96}, torch::kInt64);
  return ptrain::tensor_data(x, y, x.narrow(0, 0, 16), y.narrow(0, 0, 16));
}

ptrain::TrainConfig config_for(const std::string& strategy, int64_t batch) {
  ptrain::TrainConfig c;
  c.run.strategy = strategy;
  c.run.batch_size = batch;
  c.run.max_steps = 4;
  c.run.device = "cpu";
  c.run.threads = 1;
  c.run.progress = "none";
  c.run.seed = 2;
  c.optim.lr = 0.1;
  c.optim.schedule = "constant";
  c.data.augment = false;
  return c;
}

std::shared_ptr<ptrain::ModuleModel> make_model() {
  torch::manual_seed(0);
  return ptrain::wrap(std::make_shared<Net>(), "net");
}

TEST(LibraryApi, WrapKeepsTheModulesTensorsAndNamesAndFindsItsUnits) {
  auto net = std::make_shared<Net>();
  auto model = ptrain::wrap(net, "net");
  const auto ours = model->named_parameters(), theirs = net->named_parameters();
  ASSERT_EQ(ours.size(), theirs.size());
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_EQ(ours[i].key(), theirs[i].key());
    EXPECT_TRUE(ours[i].value().is_same(theirs[i].value()));
  }
  EXPECT_EQ(theirs[2].key(), "block1.conv.weight");  // fully_shard does not rename
  const auto units = model->units();
  ASSERT_EQ(units.size(), 2u);
  EXPECT_EQ(units[0].first, "block1");
  EXPECT_EQ(units[1].first, "block2");
  EXPECT_TRUE(model->units_run_themselves());
  const auto x = torch::randn({2, 3, 8, 8});
  EXPECT_TRUE(torch::equal(model->forward(x), net->forward(x)));
}

TEST(LibraryApi, RefusesNestedUnitsAndDpWithoutAFactory) {
  try {
    ptrain::wrap(std::make_shared<Nested>(), "nested");
    FAIL() << "nested units must be refused";
  } catch (const ptrain::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'outer.block1' of model 'nested' lies inside the unit 'outer'"),
              std::string::npos) << e.what();
  }
  auto c = config_for("dp", 8);
  c.dist.replicas = 2;
  try {
    ptrain::fit(make_model(), images(), c);
    FAIL() << "dp without a factory must be refused";
  } catch (const ptrain::Error& e) {
    EXPECT_NE(std::string(e.what()).find("give ptrain::wrap a function that builds a fresh module"), std::string::npos)
        << e.what();
  }
}

std::vector<double> fit_and_record(const ptrain::TrainConfig& c) {
  std::vector<double> losses;
  ptrain::TrainHooks hooks;
  hooks.on_step = [&](const ptrain::StepReport& r) { losses.push_back(r.loss); };
  const auto record = ptrain::fit(make_model(), images(), c, hooks);
  EXPECT_EQ(record.steps, 4);
  return losses;
}

TEST(LibraryApi, Zero3GathersEachMarkedUnitAsOneProcessTrainsTheWholeBatch) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  struct Dir {
    std::string path = ptrain::testing::temp_dir("api_zero3");
    ~Dir() { ptrain::testing::remove_tree(path); }
  } dir;
  const int port = ptrain::testing::free_port();
  const auto outcomes = ptrain::testing::run_world(
      2,
      [&](int rank) {
        ::setenv("RANK", std::to_string(rank).c_str(), 1);
        ::setenv("WORLD_SIZE", "2", 1);
        ::setenv("MASTER_ADDR", "127.0.0.1", 1);
        ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
        std::ofstream out(dir.path + "/losses" + std::to_string(rank));
        out.precision(17);
        for (const double l : fit_and_record(config_for("zero3", 8))) out << l << "\n";
      },
      120);
  for (size_t r = 0; r < outcomes.size(); ++r) ASSERT_EQ(outcomes[r].exit_code, 0) << outcomes[r].message;
  // One process on the global batch (16), forked too: the parent does no LibTorch work.
  const auto single = ptrain::testing::run_world(
      1,
      [&](int) {
        std::ofstream out(dir.path + "/single");
        out.precision(17);
        for (const double l : fit_and_record(config_for("single", 16))) out << l << "\n";
      },
      120);
  ASSERT_EQ(single[0].exit_code, 0) << single[0].message;
  const auto read = [&](const std::string& name) {
    std::ifstream in(dir.path + "/" + name);
    std::vector<double> v;
    double x = 0;
    while (in >> x) v.push_back(x);
    return v;
  };
  const auto r0 = read("losses0"), r1 = read("losses1"), whole = read("single");
  ASSERT_EQ(whole.size(), 4u);
  ASSERT_EQ(r0.size(), 4u);
  ASSERT_EQ(r1.size(), 4u);
  for (size_t i = 0; i < whole.size(); ++i) {
    // Each rank's loss is the mean over its half of the global batch.
    EXPECT_NEAR((r0[i] + r1[i]) / 2, whole[i], 1e-5 * whole[i]) << "step " << i + 1;
  }
  EXPECT_LT(whole.back(), whole.front());
}

// Keeps the first batch it trains on, as the model sees it.
struct InputRecorder : nn::Module {
  InputRecorder() { head = register_module("head", nn::Linear(3, 3)); }
  torch::Tensor forward(torch::Tensor x) {
    if (is_training() && !seen.defined()) seen = x.detach().clone();
    return head(x.mean({2, 3}));
  }
  nn::Linear head{nullptr};
  torch::Tensor seen;
};

// Every sample the same 3x8x8 image, so that the batch is known whatever the shuffle: pixel (c, y, x) is
// 37c + 29y + 3x (mod 256).
ptrain::Data identical_images() {
  auto image = torch::empty({3, 8, 8}, torch::kUInt8);
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t y = 0; y < 8; ++y)
      for (int64_t x = 0; x < 8; ++x) image[c][y][x] = static_cast<uint8_t>((37 * c + 29 * y + 3 * x) % 256);
  auto images = image.unsqueeze(0).repeat({16, 1, 1, 1});
  auto labels = torch::arange(16, torch::kInt64).remainder(3);
  return ptrain::tensor_data(images, labels, images.narrow(0, 0, 4), labels.narrow(0, 0, 4));
}

TEST(LibraryApi, NormalizeGivesTheModelPixelsMinusMeanOverStd) {
  const std::vector<double> means{0.25, 0.5, 0.75}, stds{0.5, 0.25, 0.125};
  for (const std::string normalize : {"0.25,0.5,0.75/0.5,0.25,0.125", "0.25,0.5"}) {
    const bool per_channel = normalize.find('/') != std::string::npos;
    auto c = config_for("single", 4);
    c.run.max_steps = 1;
    c.data.normalize = normalize;
    auto net = std::make_shared<InputRecorder>();
    const auto record = ptrain::fit(ptrain::wrap(net, "recorder"), identical_images(), c);
    ASSERT_TRUE(net->seen.defined());
    ASSERT_EQ(net->seen.sizes(), (std::vector<int64_t>{4, 3, 8, 8}));
    const auto seen = net->seen.to(torch::kDouble);
    double worst = 0;
    for (int64_t b = 0; b < 4; ++b)
      for (int64_t ch = 0; ch < 3; ++ch)
        for (int64_t y = 0; y < 8; ++y)
          for (int64_t x = 0; x < 8; ++x) {
            const double pixel = ((37 * ch + 29 * y + 3 * x) % 256) / 255.0;
            const double mean = per_channel ? means[ch] : 0.25, std = per_channel ? stds[ch] : 0.5;
            worst = std::max(worst, std::abs(seen[b][ch][y][x].item<double>() - (pixel - mean) / std));
          }
    EXPECT_LT(worst, 1e-5) << normalize;
    const auto& stated = record.extra.at("data_transforms");
    EXPECT_EQ(stated.at("normalize").at("mean").get<std::vector<double>>().size(), per_channel ? 3u : 1u);
    EXPECT_NEAR(stated.at("normalize").at("std").at(0).get<double>(), 0.5, 1e-7);
    EXPECT_NE(stated.at("train").get<std::string>().find("normalise mean 0.25"), std::string::npos) << stated;
    EXPECT_EQ(stated.at("train").get<std::string>().find("random crop"), std::string::npos) << stated;  // augment off
  }
}

TEST(LibraryApi, NormalizeValuesForAnotherChannelCountAreRefused) {
  auto c = config_for("single", 4);
  c.data.normalize = "0.1,0.2/0.3,0.4";
  try {
    ptrain::fit(ptrain::wrap(std::make_shared<InputRecorder>(), "recorder"), identical_images(), c);
    FAIL() << "two channel values for three channels must be refused";
  } catch (const ptrain::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--normalize"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("3-channel images"), std::string::npos) << e.what();
  }
}

}  // namespace
