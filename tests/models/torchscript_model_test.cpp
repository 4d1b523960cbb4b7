// TorchScript models from tests/oracles/torchscript_model.py (made at build time into
// PTRAIN_TORCHSCRIPT_FIXTURES): units cut from the forward graph run as the whole forward does, state_dict
// names are PyTorch's, checkpointed units give the gradients of plain ones, and files or modules ptrain
// cannot train are refused naming the file and what was expected.
#include <gtest/gtest.h>

#include <fstream>

#include "model_test_support.h"
#include "ptrain/core/error.h"
#include "ptrain/io/pth.h"
#include "ptrain/models/state_dict.h"
#include "ptrain/models/torchscript_model.h"
#include "ptrain/models/zoo.h"
#include "test_support.h"

namespace ptrain::models {
namespace {

std::string fixture(const std::string& name) { return std::string(PTRAIN_TORCHSCRIPT_FIXTURES) + "/" + name; }

ScriptInput images(int64_t classes = 4, int64_t channels = 3) {
  ScriptInput input;
  input.sample_shape = {channels, 16, 16};
  input.classes = classes;
  input.data_description = "the test images";
  return input;
}

std::vector<std::string> unit_names(TorchScriptModel& model) {
  std::vector<std::string> names;
  for (const auto& [name, module] : model.units()) names.push_back(name);
  return names;
}

std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

const std::vector<std::string> kNetUnits = {"stem.0", "stem.1", "stem.2", "blocks.0", "blocks.1", "down", "head"};

TEST(TorchScriptModel, UnitsAreTheCallsOfTheForwardChainOpenedThroughContainers) {
  for (const char* file : {"net.pt", "traced.pt"}) {
    auto model = TorchScriptModel::load(fixture(file), images());
    EXPECT_EQ(unit_names(*model), kNetUnits) << file;
    EXPECT_EQ(model->units_note(), "") << file;
    // The root parameter (scale, read between the units) belongs to no unit.
    int64_t in_units = 0, all = 0;
    for (const auto& [name, module] : model->units())
      for (const auto& p : module->parameters()) in_units += p.numel();
    for (const auto& p : model->parameters()) all += p.numel();
    EXPECT_EQ(all - in_units, 1) << file;
  }
}

TEST(TorchScriptModel, UnitsRunOneAfterAnotherAsTheWholeForward) {
  auto model = TorchScriptModel::load(fixture("net.pt"), images());
  torch::manual_seed(1);
  const auto x = torch::randn({3, 3, 16, 16});
  auto y = x;
  for (size_t i = 0; i < model->units().size(); ++i) y = model->forward_unit(i, y);
  const auto whole = model->forward(x);
  EXPECT_TRUE(torch::allclose(y, whole, 1e-6, 1e-6)) << (y - whole).abs().max();
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{3, 4}));
}

TEST(TorchScriptModel, ParametersAndBuffersKeepPyTorchStateDictNames) {
  auto model = TorchScriptModel::load(fixture("net.pt"), images());
  const auto saved = io::read_pth(fixture("state_dict.pt"));
  const auto ours = state_dict(*model);
  ASSERT_EQ(ours.size(), saved.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    EXPECT_EQ(ours[i].first, saved[i].first);
    EXPECT_TRUE(torch::equal(ours[i].second, saved[i].second)) << saved[i].first;
  }
  // Strict loading names the file and the key that does not fit.
  io::NamedTensors wrong = saved;
  wrong.back().second = torch::zeros({7});
  const auto message = error_of([&] { load_state_dict(*model, wrong, "weights.pt"); });
  EXPECT_NE(message.find("weights.pt"), std::string::npos) << message;
  EXPECT_NE(message.find("shape mismatch for " + saved.back().first), std::string::npos) << message;
}

TEST(TorchScriptModel, ParametersAreTheModulesOwnTensors) {
  // What the strategies do to the model's parameters (set_data: move, cast, flatten, free) the module sees.
  auto model = TorchScriptModel::load(fixture("net.pt"), images());
  const auto x = torch::randn({2, 3, 16, 16});
  const auto before = model->forward(x);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->named_parameters()) {
      if (p.key() == "head.bias") p.value().set_data(p.value().detach() + 1.0);
    }
  }
  const auto after = model->forward(x);
  EXPECT_TRUE(torch::allclose(after, before + 1.0, 1e-5, 1e-5));
}

TEST(TorchScriptModel, HalfPrecisionConvertsFloatingTensorsOnlyAndTrainingModeReachesTheModule) {
  auto model = TorchScriptModel::load(fixture("bn.pt"), images());
  EXPECT_EQ(unit_names(*model), (std::vector<std::string>{"0", "1", "2", "3", "4", "5", "6"}));
  model->to(torch::kBFloat16);
  for (const auto& b : model->named_buffers()) {
    const bool counter = b.key().find("num_batches_tracked") != std::string::npos;
    EXPECT_EQ(b.value().scalar_type(), counter ? torch::kLong : torch::kBFloat16) << b.key();
  }
  for (const auto& p : model->parameters()) EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
  model->to(torch::kFloat);
  const auto x = torch::randn({4, 3, 16, 16});
  model->train();
  const auto train_out = model->forward(x);
  const auto tracked = [&] {
    for (const auto& b : model->named_buffers())
      if (b.key() == "1.num_batches_tracked") return b.value().item<int64_t>();
    return int64_t{-1};
  };
  EXPECT_EQ(tracked(), 1);
  model->eval();
  const auto a = model->forward(x), b = model->forward(x);
  EXPECT_TRUE(torch::equal(a, b)) << "eval mode must switch off dropout";
  EXPECT_EQ(tracked(), 1);
  EXPECT_NE(model->checkpointing_note().find("aten::dropout"), std::string::npos) << model->checkpointing_note();
}

TEST(TorchScriptModel, ForwardWithoutChainHasNoUnitsAndSaysWhy) {
  auto model = TorchScriptModel::load(fixture("skip.pt"), images());
  EXPECT_TRUE(model->units().empty());
  EXPECT_NE(model->units_note().find("not a chain of submodule calls"), std::string::npos) << model->units_note();
  const auto message = error_of([&] { model->set_activation_checkpointing(true); });
  EXPECT_NE(message.find("--activation-checkpointing"), std::string::npos) << message;
  EXPECT_NE(message.find("skip.pt"), std::string::npos) << message;
}

TEST(TorchScriptModel, CheckpointedUnitsGiveTheGradientsOfPlainOnes) {
  const auto x = torch::randn({4, 3, 16, 16});
  const auto y = torch::tensor({0, 1, 2, 3});
  std::vector<std::vector<torch::Tensor>> grads;
  for (const bool checkpointing : {false, true}) {
    auto model = TorchScriptModel::load(fixture("net.pt"), images());
    model->set_activation_checkpointing(checkpointing);
    model->train();
    auto h = x;
    for (size_t i = 0; i < model->units().size(); ++i) h = model->forward_unit(i, h);
    torch::nn::functional::cross_entropy(h, y).backward();
    grads.emplace_back();
    for (const auto& p : model->parameters()) grads.back().push_back(p.grad().clone());
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_TRUE(torch::allclose(grads[0][i], grads[1][i], 1e-5, 1e-6)) << "parameter " << i;
  }
}

TEST(TorchScriptModel, ReplicaHoldsItsOwnCopyOfTheParameters) {
  auto model = TorchScriptModel::load(fixture("net.pt"), images());
  auto replica = std::dynamic_pointer_cast<TorchScriptModel>(model->make_replica());
  ASSERT_NE(replica, nullptr);
  EXPECT_EQ(unit_names(*replica), kNetUnits);
  const auto ours = model->parameters(), theirs = replica->parameters();
  ASSERT_EQ(ours.size(), theirs.size());
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_TRUE(torch::equal(ours[i], theirs[i]));
    EXPECT_NE(ours[i].data_ptr(), theirs[i].data_ptr());
  }
}

TEST(TorchScriptModel, RefusesWhatItCannotTrainNamingTheFile) {
  struct Case {
    std::string file;
    ScriptInput input;
    std::vector<std::string> expected;
  };
  const testing::TempDir dir;
  const std::string junk = dir.file("junk.pt");
  std::ofstream(junk) << "not a zip archive at all";
  const std::vector<Case> cases = {
      {fixture("tuple.pt"), images(), {"tuple.pt", "forward is", "returns one tensor of logits"}},
      {fixture("state_dict.pt"), images(), {"state_dict.pt", "torch.save file", "torch.jit.script"}},
      {junk, images(), {"junk.pt", "not a TorchScript archive"}},
      {fixture("net.pt"), images(10), {"net.pt", "returns shape [2, 4]", "expected logits [2, 10]", "the test images"}},
      {fixture("net.pt"), images(4, 1), {"net.pt", "forward fails on a batch of shape [2, 1, 16, 16]"}},
  };
  for (const auto& c : cases) {
    const auto message = error_of([&] { TorchScriptModel::load(c.file, c.input); });
    for (const auto& part : c.expected) EXPECT_NE(message.find(part), std::string::npos) << c.file << ": " << message;
  }
}

TEST(TorchScriptModel, TheZooLoadsFilesEndingInPt) {
  EXPECT_TRUE(is_torchscript_path("my/model.pt"));
  EXPECT_TRUE(is_torchscript_path("model.pth"));
  EXPECT_FALSE(is_torchscript_path("resnet18"));
  EXPECT_FALSE(is_torchscript_path(".pt"));
  ModelSpec spec{fixture("net.pt"), 4, 3, 16};
  auto model = make_model(spec);
  EXPECT_EQ(model->name(), fixture("net.pt"));
  EXPECT_EQ(model->units().size(), kNetUnits.size());
}

}  // namespace
// torch.jit.trace records the module's mode in the graph (batch norm's and dropout's training argument as
// a constant); torch.jit.script reads the module's training attribute. Only the former is warned about.
TEST(TorchScriptModel, WarnsAboutTheModeATraceRecorded) {
  const auto trained = TorchScriptModel::load(fixture("bn_traced_train.pt"), images());
  const std::string train_warning = trained->recorded_mode_warning();
  EXPECT_NE(train_warning.find("bn_traced_train.pt was traced in training mode"), std::string::npos) << train_warning;
  EXPECT_NE(train_warning.find("1 batch norm on batch statistics and 1 dropout on in evaluation"), std::string::npos)
      << train_warning;
  EXPECT_NE(train_warning.find("torch.jit.script(model)"), std::string::npos) << train_warning;
  EXPECT_EQ(train_warning.find("eval mode"), std::string::npos) << train_warning;

  const auto evaluated = TorchScriptModel::load(fixture("bn_traced_eval.pt"), images());
  const std::string eval_warning = evaluated->recorded_mode_warning();
  EXPECT_NE(eval_warning.find("was traced in eval mode"), std::string::npos) << eval_warning;
  EXPECT_NE(eval_warning.find("1 batch norm on running statistics (frozen: never updated) and 1 dropout off while "
                              "training"),
            std::string::npos)
      << eval_warning;

  // The warning is about behaviour: the eval-mode trace really keeps its running statistics in training.
  evaluated->train(true);
  const auto before = evaluated->named_buffers()["1.running_mean"].clone();
  evaluated->forward(torch::rand({4, 3, 16, 16}));
  EXPECT_TRUE(torch::equal(before, evaluated->named_buffers()["1.running_mean"]));

  EXPECT_EQ(TorchScriptModel::load(fixture("bn.pt"), images())->recorded_mode_warning(), "");     // scripted
  EXPECT_EQ(TorchScriptModel::load(fixture("traced.pt"), images())->recorded_mode_warning(), "");  // no mode to fix
}

}  // namespace ptrain::models
