#include "ptrain/models/zoo.h"

#include <gtest/gtest.h>

#include <set>

#include "model_test_support.h"
#include "ptrain/core/error.h"
#include "ptrain/models/resnet.h"
#include "ptrain/models/state_dict.h"
#include "test_support.h"

namespace {

using ptrain::models::make_model;
using ptrain::models::ModelSpec;
using ptrain::testing::tensor_named;

std::vector<int64_t> conv1_shape(const std::shared_ptr<ptrain::models::Model>& model) {
  return tensor_named(ptrain::models::state_dict(*model), "conv1.weight").sizes().vec();
}

TEST(Zoo, StemFollowsImageSizeUnlessForced) {
  EXPECT_EQ(conv1_shape(make_model({"resnet18", 10, 3, 32})), (std::vector<int64_t>{64, 3, 3, 3}));
  EXPECT_EQ(conv1_shape(make_model({"resnet18", 10, 3, 64})), (std::vector<int64_t>{64, 3, 3, 3}));
  EXPECT_EQ(conv1_shape(make_model({"resnet18", 10, 3, 224})), (std::vector<int64_t>{64, 3, 7, 7}));
  EXPECT_EQ(conv1_shape(make_model({"resnet50-imagenet", 10, 3, 32})), (std::vector<int64_t>{64, 3, 7, 7}));
  EXPECT_EQ(conv1_shape(make_model({"resnet34-cifar", 10, 1, 224})), (std::vector<int64_t>{64, 1, 3, 3}));
  EXPECT_EQ(make_model({"resnet18", 10, 3, 32})->name(), "resnet18-cifar");
  EXPECT_EQ(make_model({"resnet18", 10, 3, 224})->name(), "resnet18");
}

// He et al. 2016, section 4.2: 6n+2 layers, 16/32/64 filters; resnet20 has about 0.27M parameters.
TEST(Zoo, CifarResNetsHaveThePaperShape) {
  for (const auto& [name, n] : std::vector<std::pair<std::string, int>>{{"resnet20", 3}, {"resnet32", 5}, {"resnet56", 9}}) {
    auto model = make_model({name, 10, 1, 28});
    const auto tensors = ptrain::models::state_dict(*model);
    int convs = 0;
    for (const auto& [key, tensor] : tensors) {
      if (tensor.dim() == 4 && key.find("downsample") == std::string::npos) ++convs;
    }
    EXPECT_EQ(convs + 1, 6 * n + 2) << name;  // + fc
    EXPECT_EQ(tensor_named(tensors, "conv1.weight").sizes().vec(), (std::vector<int64_t>{16, 1, 3, 3}));
    EXPECT_EQ(tensor_named(tensors, "layer3.0.downsample.0.weight").sizes().vec(), (std::vector<int64_t>{64, 32, 1, 1}));
    EXPECT_EQ(tensor_named(tensors, "fc.weight").sizes().vec(), (std::vector<int64_t>{10, 64}));
    torch::NoGradGuard no_grad;
    EXPECT_EQ(model->forward(torch::randn({2, 1, 28, 28})).sizes().vec(), (std::vector<int64_t>{2, 10}));
  }
  int64_t params = 0;
  for (const auto& p : make_model({"resnet20", 10, 3, 32})->parameters()) params += p.numel();
  EXPECT_NEAR(static_cast<double>(params), 0.27e6, 0.01e6);
}

TEST(Zoo, UnknownNameListsKnownOnes) {
  const auto message = ptrain::testing::error_message<ptrain::Error>([] { make_model({"resnet19", 10, 3, 32}); });
  EXPECT_NE(message.find("resnet19"), std::string::npos) << message;
  for (const auto& name : ptrain::models::model_names()) EXPECT_NE(message.find(name), std::string::npos) << name;
  EXPECT_THROW(make_model({"resnet18", 0, 3, 32}), ptrain::Error);
}

TEST(Zoo, EveryNameBuildsAndRunsOneImage) {
  torch::NoGradGuard no_grad;
  for (const auto& name : ptrain::models::model_names()) {
    if (name.find("101") != std::string::npos || name.find("152") != std::string::npos) continue;  // slow, same code
    if (ptrain::models::is_language_model(name)) continue;  // tokens in: gpt_test.cpp
    auto model = make_model({name, 7, 3, 32});
    model->eval();
    EXPECT_EQ(model->forward(torch::randn({1, 3, 32, 32})).sizes().vec(), (std::vector<int64_t>{1, 7})) << name;
  }
}

// units() partitions the state_dict in forward order, and running the units one by one is forward().
TEST(Zoo, UnitsCoverEveryTensorOnceAndComposeToForward) {
  for (const std::string name : {"resnet18", "resnet50-imagenet", "resnet20"}) {
    auto model = make_model({name, 10, 3, 64});
    model->eval();
    std::vector<std::string> from_units;
    const auto units = model->units();
    for (const auto& [unit, module] : units) {
      for (const auto& [key, tensor] : ptrain::models::state_dict(*module)) {
        from_units.push_back(unit == "stem" ? key : unit + "." + key);
      }
    }
    std::vector<std::string> all;
    for (const auto& [key, tensor] : ptrain::models::state_dict(*model)) all.push_back(key);
    EXPECT_EQ(from_units, all) << name;
    EXPECT_EQ(units.front().first, "stem");
    EXPECT_EQ(units[1].first, "layer1.0");
    EXPECT_EQ(units.back().first, "fc");

    torch::NoGradGuard no_grad;
    auto x = torch::randn({2, 3, 64, 64});
    const auto expected = model->forward(x);
    for (size_t i = 0; i < units.size(); ++i) x = model->forward_unit(i, x);
    EXPECT_TRUE(torch::equal(x, expected)) << name;
  }
}

}  // namespace
