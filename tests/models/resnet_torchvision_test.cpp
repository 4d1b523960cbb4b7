// ptrain's ResNets against torchvision's, run by the oracle Python: same state_dict names and shapes in
// the same order, same logits with the same weights, and weights that move both ways.
#include <gtest/gtest.h>

#include <cmath>

#include <fstream>
#include <sstream>

#include "model_test_support.h"
#include "ptrain/core/error.h"
#include "ptrain/io/pth.h"
#include "ptrain/models/resnet.h"
#include "ptrain/models/state_dict.h"
#include "test_support.h"

namespace {

using ptrain::models::ResNet;
using ptrain::models::ResNetOptions;
using ptrain::testing::relative_error;
using ptrain::testing::run_oracle;
using ptrain::testing::TempDir;
using ptrain::testing::tensor_named;

struct Case {
  std::string arch;
  int depth;
  int64_t num_classes;
  bool cifar_stem;
  int64_t image_size;

  std::string oracle_args() const {
    return "--arch " + arch + " --num-classes " + std::to_string(num_classes) + " --image-size " +
           std::to_string(image_size) + (cifar_stem ? " --cifar-stem" : "");
  }
  std::shared_ptr<ResNet> make() const {
    ResNetOptions options;
    options.depth = depth;
    options.num_classes = num_classes;
    options.cifar_stem = cifar_stem;
    return std::make_shared<ResNet>(options);
  }
};

std::string shape_text(const torch::Tensor& t) {
  std::string text;
  for (auto d : t.sizes()) text += (text.empty() ? "" : ",") + std::to_string(d);
  return text;
}

void export_from_torchvision(const Case& c, const TempDir& dir) {
  const auto oracle = run_oracle("torchvision_resnet.py", "export " + c.oracle_args() + " --out " + dir.path());
  ASSERT_EQ(oracle.exit_code, 0) << oracle.output;
}

void expect_same_names_and_shapes(const Case& c) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(export_from_torchvision(c, dir));
  std::ifstream names(dir.file("names.txt"));
  const auto ours = ptrain::models::state_dict(*c.make());
  size_t i = 0;
  std::string line;
  while (std::getline(names, line)) {
    const auto tab = line.find('\t');
    ASSERT_LT(i, ours.size()) << "torchvision has more entries, next: " << line;
    EXPECT_EQ(ours[i].first, line.substr(0, tab)) << "entry " << i;
    EXPECT_EQ(shape_text(ours[i].second), line.substr(tab + 1)) << ours[i].first;
    ++i;
  }
  EXPECT_EQ(i, ours.size()) << "ptrain has more entries than torchvision";
  EXPECT_GT(i, 60u);
}

TEST(ResNetVsTorchvision, Resnet18StateDictNamesAndShapes) { expect_same_names_and_shapes({"resnet18", 18, 10, false, 64}); }
TEST(ResNetVsTorchvision, Resnet50StateDictNamesAndShapes) { expect_same_names_and_shapes({"resnet50", 50, 1000, false, 64}); }
TEST(ResNetVsTorchvision, Resnet18CifarStemStateDictNamesAndShapes) {
  expect_same_names_and_shapes({"resnet18", 18, 10, true, 32});
}

// Loads torchvision's weights, then compares eval logits, train-mode logits and the running statistics
// that the train-mode forward leaves behind.
void expect_same_outputs(const Case& c) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(export_from_torchvision(c, dir));
  auto model = c.make();
  ptrain::models::load_weights(*model, dir.file("weights.pth"));
  const auto io = ptrain::io::read_pth(dir.file("io.pth"));
  const auto& input = tensor_named(io, "input");
  torch::NoGradGuard no_grad;
  model->eval();
  EXPECT_LT(relative_error(model->forward(input), tensor_named(io, "logits_eval")), 1e-4);
  model->train();
  EXPECT_LT(relative_error(model->forward(input), tensor_named(io, "logits_train")), 1e-4);
  const auto after = ptrain::io::read_pth(dir.file("after_train.pth"));
  for (const auto& [name, tensor] : ptrain::models::state_dict(*model)) {
    const auto& reference = tensor_named(after, name);
    if (name.find("num_batches_tracked") != std::string::npos) {
      EXPECT_EQ(tensor.item<int64_t>(), reference.item<int64_t>()) << name;
    } else if (reference.norm().item<double>() > 0) {
      EXPECT_LT(relative_error(tensor, reference), 1e-4) << name;
    }
  }
}

TEST(ResNetVsTorchvision, Resnet18LogitsAndBatchNormUpdates) { expect_same_outputs({"resnet18", 18, 10, false, 64}); }
TEST(ResNetVsTorchvision, Resnet50LogitsAndBatchNormUpdates) { expect_same_outputs({"resnet50", 50, 1000, false, 64}); }
TEST(ResNetVsTorchvision, Resnet18CifarStemLogits) { expect_same_outputs({"resnet18", 18, 10, true, 32}); }

// Initialisation is random on both sides, so compare its distribution per tensor: kaiming-normal
// (fan_out, relu) convolutions, BatchNorm at weight 1 / bias 0, and the default Linear bounds.
TEST(ResNetVsTorchvision, InitialisationFollowsTorchvision) {
  const Case c{"resnet18", 18, 1000, false, 64};
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(export_from_torchvision(c, dir));
  const auto reference = ptrain::io::read_pth(dir.file("weights.pth"));
  torch::manual_seed(1);
  const auto ours = ptrain::models::state_dict(*c.make());
  int compared = 0;
  for (const auto& [name, tensor] : ours) {
    const auto& theirs = tensor_named(reference, name);
    if (name.find("running") != std::string::npos || name.find("num_batches") != std::string::npos ||
        name.find("bn") != std::string::npos || name.find("downsample.1") != std::string::npos) {
      EXPECT_TRUE(torch::equal(tensor, theirs)) << name;
      continue;
    }
    if (tensor.numel() < 2000) continue;
    const double ratio = tensor.std().item<double>() / theirs.std().item<double>();
    EXPECT_NEAR(ratio, 1.0, 0.1) << name;
    const double max_ratio = tensor.abs().max().item<double>() / theirs.abs().max().item<double>();
    if (name.rfind("fc.", 0) == 0) { EXPECT_NEAR(max_ratio, 1.0, 0.01) << name; }  // uniform: max ~ bound
    ++compared;
  }
  EXPECT_GT(compared, 15);
}

TEST(ResNetVsTorchvision, ZeroInitResidualZeroesLastBatchNormOfEachBlock) {
  ResNetOptions options;
  options.depth = 50;
  options.zero_init_residual = true;
  const auto tensors = ptrain::models::state_dict(ResNet(options));
  EXPECT_EQ(tensor_named(tensors, "layer1.0.bn3.weight").abs().sum().item<double>(), 0.0);
  EXPECT_EQ(tensor_named(tensors, "layer4.2.bn3.weight").abs().sum().item<double>(), 0.0);
  EXPECT_TRUE(torch::all(tensor_named(tensors, "layer1.0.bn2.weight") == 1).item<bool>());
}

// Weights exported by ptrain, loaded into torchvision by Python, give ptrain's logits.
void expect_torchvision_reproduces_export(const Case& c, const std::string& extension) {
  TempDir dir;
  torch::manual_seed(7);
  auto model = c.make();
  model->eval();
  const auto input = torch::randn({2, 3, c.image_size, c.image_size});
  torch::Tensor logits;
  {
    torch::NoGradGuard no_grad;
    logits = model->forward(input);
  }
  const auto weights = dir.file("weights" + extension);
  ptrain::models::save_weights(*model, weights);
  ptrain::io::write_pth(dir.file("io.pth"), {{"input", input}, {"logits", logits}});
  const auto oracle = run_oracle("torchvision_resnet.py", "check " + c.oracle_args() + " --weights " + weights +
                                                                " --io " + dir.file("io.pth"));
  EXPECT_EQ(oracle.exit_code, 0) << oracle.output;
}

TEST(ResNetExport, TorchvisionLoadsOurPth) { expect_torchvision_reproduces_export({"resnet18", 18, 10, false, 64}, ".pth"); }
TEST(ResNetExport, TorchvisionLoadsOurSafetensors) {
  expect_torchvision_reproduces_export({"resnet50", 50, 1000, false, 64}, ".safetensors");
}

TEST(ResNetBadWeights, WrongClassCountListsKeysAndBothShapes) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(export_from_torchvision({"resnet18", 18, 10, false, 64}, dir));
  ResNetOptions options;
  options.depth = 18;
  options.num_classes = 1000;
  ResNet model(options);
  const auto before = tensor_named(ptrain::models::state_dict(model), "conv1.weight").clone();
  const auto path = dir.file("weights.pth");
  const auto message = ptrain::testing::error_message<ptrain::Error>([&] { ptrain::models::load_weights(model, path); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("fc.weight: expected [1000, 512], found [10, 512]"), std::string::npos) << message;
  EXPECT_NE(message.find("fc.bias: expected [1000], found [10]"), std::string::npos) << message;
  EXPECT_TRUE(torch::equal(tensor_named(ptrain::models::state_dict(model), "conv1.weight"), before))
      << "a refused load must not change the model";
}

TEST(ResNetBadWeights, MissingAndUnexpectedKeysAreListed) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(export_from_torchvision({"resnet18", 18, 10, false, 64}, dir));
  ResNetOptions options;
  options.depth = 34;
  options.num_classes = 10;
  ResNet model(options);
  const auto message = ptrain::testing::error_message<ptrain::Error>(
      [&] { ptrain::models::load_weights(model, dir.file("weights.pth")); });
  EXPECT_NE(message.find("missing key layer1.2.conv1.weight (expected shape [64, 64, 3, 3])"), std::string::npos)
      << message;
  auto tensors = ptrain::models::state_dict(model);
  tensors.emplace_back("head.extra", torch::zeros({3}));
  const auto unexpected = ptrain::testing::error_message<ptrain::Error>(
      [&] { ptrain::models::load_state_dict(model, tensors, "extra.pth"); });
  EXPECT_NE(unexpected.find("extra.pth"), std::string::npos) << unexpected;
  EXPECT_NE(unexpected.find("unexpected key head.extra (shape [3])"), std::string::npos) << unexpected;
}

TEST(ResNetBadWeights, TruncatedFilesAndUnknownExtensionAreNamed) {
  TempDir dir;
  ResNetOptions options;
  options.depth = 18;
  options.num_classes = 10;
  ResNet model(options);
  for (const std::string ext : {".pth", ".safetensors"}) {
    const auto path = dir.file("weights" + ext);
    ptrain::models::save_weights(model, path);
    const auto whole = ptrain::testing::read_bytes(path);
    ptrain::testing::write_bytes(path, whole.substr(0, whole.size() * 2 / 3));
    const auto message = ptrain::testing::error_message<ptrain::Error>([&] { ptrain::models::load_weights(model, path); });
    EXPECT_NE(message.find(path), std::string::npos) << message;
  }
  const auto odd = dir.file("weights.ckpt");
  const auto message = ptrain::testing::error_message<ptrain::Error>([&] { ptrain::models::save_weights(model, odd); });
  EXPECT_NE(message.find(odd), std::string::npos) << message;
  EXPECT_NE(message.find(".ckpt"), std::string::npos) << message;
}

// The two mix-ups that fail every key get one line saying what the file is, not a line per key.
TEST(ResNetBadWeights, WrappedStateDictsCheckpointsAndNaNsAreNamedInOneLine) {
  ResNetOptions options;
  options.depth = 20;
  options.num_classes = 10;
  ResNet model(options);
  const auto own = ptrain::models::state_dict(model);
  ptrain::io::NamedTensors wrapped, checkpoint, poisoned;
  for (const auto& [name, tensor] : own) {
    wrapped.emplace_back("module." + name, tensor.clone());
    checkpoint.emplace_back("model/" + name, tensor.clone());
    poisoned.emplace_back(name, tensor.clone());
  }
  const auto load = [&](const ptrain::io::NamedTensors& tensors) {
    return ptrain::testing::error_message<ptrain::Error>([&] { ptrain::models::load_state_dict(model, tensors, "w.pth"); });
  };
  const auto module = load(wrapped);
  EXPECT_NE(module.find("w.pth: every key starts with 'module.'"), std::string::npos) << module;
  EXPECT_NE(module.find(std::to_string(own.size()) + " of " + std::to_string(own.size()) + " keys match"), std::string::npos)
      << module;
  EXPECT_EQ(module.find('\n'), std::string::npos) << module;
  const auto ours = load(checkpoint);
  EXPECT_NE(ours.find("it is a ptrain training checkpoint, not a weights file: continue it with --resume w.pth"),
            std::string::npos)
      << ours;
  EXPECT_EQ(ours.find('\n'), std::string::npos) << ours;
  poisoned[3].second.view(-1)[0] = NAN;
  const auto nan = load(poisoned);
  EXPECT_NE(nan.find("tensor " + poisoned[3].first + " holds NaN or infinite values"), std::string::npos) << nan;
}

TEST(ResNetWeights, LoadConvertsDtypeAndKeepsValues) {
  ResNetOptions options;
  options.depth = 20;
  options.num_classes = 10;
  ResNet source(options), target(options);
  ptrain::io::NamedTensors as_double;
  for (const auto& [name, tensor] : ptrain::models::state_dict(source)) {
    as_double.emplace_back(name, tensor.is_floating_point() ? tensor.to(torch::kDouble) : tensor);
  }
  ptrain::models::load_state_dict(target, as_double, "memory");
  const auto loaded = ptrain::models::state_dict(target);
  for (const auto& [name, tensor] : ptrain::models::state_dict(source)) {
    EXPECT_EQ(tensor_named(loaded, name).scalar_type(), tensor.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(tensor_named(loaded, name), tensor)) << name;
  }
}

}  // namespace
