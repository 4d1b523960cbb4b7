// Model::forward_flops, what model FLOP utilisation counts: ResNets against torchvision's layers counted by hooks
// on the shapes they really see (python3-torchvision as the oracle) and against a count by hand, GPT against its
// parameters' shapes.
#include <gtest/gtest.h>

#include <sstream>

#include "ptrain/models/zoo.h"
#include "test_support.h"

namespace {

using ptrain::testing::run_oracle;

double torchvision_flops(const std::string& arch, int64_t size) {
  const auto oracle = run_oracle("model_flops.py", arch + " " + std::to_string(size));
  EXPECT_EQ(oracle.exit_code, 0) << oracle.output;
  std::istringstream line(oracle.output);
  std::string word;
  double flops = 0;
  line >> word >> flops;
  EXPECT_EQ(word, "flops") << oracle.output;
  return flops;
}

double forward_flops(const std::string& name, int64_t classes, int64_t channels, int64_t size) {
  const auto model = ptrain::models::make_model({name, classes, channels, size});
  const auto flops = model->forward_flops({channels, size, size});
  EXPECT_TRUE(flops.has_value()) << name;
  return flops.value_or(0);
}

// ResNet-50 at 224 pixels: 4.09 GMACs as torchvision's documentation gives it (8.18 GFLOPs at two a multiply-add),
// and layer for layer what torchvision's own modules see.
TEST(ModelFlops, ResNet50MatchesTorchvision) {
  const double ours = forward_flops("resnet50", 1000, 3, 224);
  EXPECT_DOUBLE_EQ(ours, torchvision_flops("resnet50", 224));
  EXPECT_NEAR(ours / 2e9, 4.09, 0.01);
}

// An odd size, where every stride rounds: 161 -> 81 -> 41 -> 21 -> 11 -> 6.
TEST(ModelFlops, ResNet18AtAnOddSizeMatchesTorchvision) {
  EXPECT_DOUBLE_EQ(forward_flops("resnet18", 1000, 3, 161), torchvision_flops("resnet18", 161));
}

// He et al.'s resnet20 on a 28 x 28 Fashion-MNIST image, by hand: a 3x3 stem to 16 channels, three stages of three
// basic blocks (16, 32, 64 channels at 28, 14 and 7 pixels), each later stage's first block striding with a 1x1
// shortcut convolution, and a 64 -> 10 head.
TEST(ModelFlops, ResNet20CountedByHand) {
  const auto conv = [](double in, double out, double kernel, double side) { return 2 * in * kernel * kernel * out * side * side; };
  double expected = conv(1, 16, 3, 28);
  expected += 6 * conv(16, 16, 3, 28);
  expected += conv(16, 32, 3, 14) + conv(32, 32, 3, 14) + conv(16, 32, 1, 14) + 4 * conv(32, 32, 3, 14);
  expected += conv(32, 64, 3, 7) + conv(64, 64, 3, 7) + conv(32, 64, 1, 7) + 4 * conv(64, 64, 3, 7);
  expected += 2 * 64 * 10;
  EXPECT_DOUBLE_EQ(forward_flops("resnet20", 10, 1, 28), expected);
}

// gpt-tiny on 48 tokens: every weight matrix but the embeddings' multiplies each token once (2 x its elements a
// token), and each block's attention multiplies Q K^T and the weights by V over the 48 x 48 square.
TEST(ModelFlops, GptCountsItsWeightMatricesAndAttention) {
  const int64_t vocab = 96, tokens = 48;
  ptrain::models::ModelSpec spec{"gpt-tiny", vocab, 0, 0};
  spec.seq_len = 64;
  const auto model = ptrain::models::make_model(spec);
  double expected = 0;
  int64_t blocks = 0, width = 0;
  for (const auto& p : model->named_parameters()) {
    const std::string& name = p.key();
    if (p.value().dim() != 2 || name == "wte.weight" || name == "wpe.weight") continue;
    expected += 2.0 * static_cast<double>(p.value().numel()) * tokens;
    if (name.find(".attn.c_proj.weight") != std::string::npos) {
      ++blocks;
      width = p.value().size(0);
    }
  }
  ASSERT_EQ(blocks, 2);
  ASSERT_EQ(width, 64);
  expected += blocks * 2.0 * (2.0 * tokens * tokens * width);
  const auto flops = model->forward_flops({tokens});
  ASSERT_TRUE(flops.has_value());
  EXPECT_DOUBLE_EQ(*flops, expected);
}

}  // namespace
