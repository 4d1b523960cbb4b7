// ptrain's GPT against a plain-PyTorch GPT-2 run by the oracle Python (tests/oracles/gpt2_reference.py):
// same names and shapes, and with the same weights the same logits, loss and gradients; then the units
// that sharding strategies cut it into, its initialisation and the zoo's sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>

#include "model_test_support.h"
#include "ptrain/core/error.h"
#include "ptrain/io/pth.h"
#include "ptrain/models/gpt.h"
#include "ptrain/models/state_dict.h"
#include "ptrain/models/zoo.h"
#include "test_support.h"

namespace {

using ptrain::models::Gpt;
using ptrain::models::GptOptions;
using ptrain::testing::relative_error;
using ptrain::testing::run_oracle;
using ptrain::testing::TempDir;
using ptrain::testing::tensor_named;

GptOptions small_options() {
  GptOptions o;
  o.vocab_size = 50;
  o.seq_len = 16;
  o.layers = 2;
  o.width = 32;
  o.heads = 4;
  return o;
}

void export_reference(const GptOptions& o, const std::string& dtype, const TempDir& dir) {
  const auto oracle = run_oracle(
      "gpt2_reference.py", "export --layers " + std::to_string(o.layers) + " --width " + std::to_string(o.width) +
                               " --heads " + std::to_string(o.heads) + " --vocab " + std::to_string(o.vocab_size) +
                               " --seq-len " + std::to_string(o.seq_len) + " --dtype " + dtype + " --out " + dir.path());
  ASSERT_EQ(oracle.exit_code, 0) << oracle.output;
}

std::string shape_text(const torch::Tensor& t) {
  std::string text;
  for (auto d : t.sizes()) text += (text.empty() ? "" : ",") + std::to_string(d);
  return text;
}

TEST(GptVsReference, StateDictNamesAndShapes) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(export_reference(small_options(), "float32", dir));
  const auto ours = ptrain::models::state_dict(Gpt(small_options()));
  std::ifstream names(dir.file("names.txt"));
  size_t i = 0;
  for (std::string line; std::getline(names, line); ++i) {
    const auto tab = line.find('\t');
    ASSERT_LT(i, ours.size()) << "the reference has more entries, next: " << line;
    EXPECT_EQ(ours[i].first, line.substr(0, tab)) << "entry " << i;
    EXPECT_EQ(shape_text(ours[i].second), line.substr(tab + 1)) << ours[i].first;
  }
  EXPECT_EQ(i, ours.size()) << "ptrain has more entries than the reference";
  EXPECT_EQ(i, 2u + 2u * 12u + 3u);
}

// Loads the reference's weights, runs forward and backward on its tokens and compares logits, loss and the
// gradient of every parameter. checkpointing recomputes each block in backward, which must not change them; fused
// runs the fused kernels' structure (each block's last residual add inside the next LayerNorm's add, on the CPU
// through LibTorch's ops), which must not either.
void expect_same_numerics(const std::string& dtype, bool checkpointing, double tolerance, bool fused = false) {
  const auto options = small_options();
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(export_reference(options, dtype, dir));
  Gpt model(options);
  const auto type = dtype == "float64" ? torch::kDouble : torch::kFloat;
  model.to(type);
  ptrain::models::load_weights(model, dir.file("weights.pth"));
  model.set_activation_checkpointing(checkpointing);
  model.set_fused_kernels(fused);
  model.train();
  const auto io = ptrain::io::read_pth(dir.file("io.pth"));
  const auto& tokens = tensor_named(io, "tokens");
  const auto& targets = tensor_named(io, "targets");
  ASSERT_EQ(tokens.scalar_type(), torch::kInt64);

  const auto logits = model.forward(tokens);
  ASSERT_EQ(logits.sizes().vec(), (std::vector<int64_t>{2, options.seq_len, options.vocab_size}));
  EXPECT_EQ(logits.scalar_type(), type);
  EXPECT_LT(relative_error(logits, tensor_named(io, "logits")), tolerance);
  const auto loss = torch::nn::functional::cross_entropy(logits.flatten(0, 1), targets.flatten());
  const double reference_loss = tensor_named(io, "loss").item<double>();
  EXPECT_NEAR(loss.item<double>(), reference_loss, tolerance * reference_loss);
  loss.backward();

  const auto grads = ptrain::io::read_pth(dir.file("grads.pth"));
  size_t compared = 0;
  for (const auto& item : model.named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    EXPECT_LT(relative_error(item.value().grad(), tensor_named(grads, item.key())), tolerance * 10) << item.key();
    ++compared;
  }
  EXPECT_EQ(compared, grads.size());
}

TEST(GptVsReference, LogitsLossAndGradientsInFloat64) { expect_same_numerics("float64", false, 1e-10); }
TEST(GptVsReference, LogitsLossAndGradientsInFloat32) { expect_same_numerics("float32", false, 1e-5); }
TEST(GptVsReference, ActivationCheckpointingChangesNothing) { expect_same_numerics("float64", true, 1e-10); }
TEST(GptVsReference, DeferredResidualAddsChangeNothing) { expect_same_numerics("float64", false, 1e-10, true); }

// Position t may not see tokens after t: changing the last token leaves every earlier position's logits.
TEST(Gpt, AttentionIsCausal) {
  torch::manual_seed(3);
  Gpt model(small_options());
  model.eval();
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(50, {1, 16}, torch::kInt64);
  const auto before = model.forward(tokens);
  tokens[0][15] = (tokens[0][15].item<int64_t>() + 1) % 50;
  const auto after = model.forward(tokens);
  EXPECT_TRUE(torch::equal(before.narrow(1, 0, 15), after.narrow(1, 0, 15)));
  EXPECT_FALSE(torch::allclose(before.select(1, 15), after.select(1, 15)));
}

// units() partitions the parameters in forward order (stem and head under top-level names), and running
// the units one by one is forward().
TEST(Gpt, UnitsCoverEveryParameterOnceAndComposeToForward) {
  torch::manual_seed(4);
  auto options = small_options();
  options.layers = 3;
  Gpt model(options);
  const auto units = model.units();
  ASSERT_EQ(units.size(), 5u);
  EXPECT_EQ(units.front().first, "stem");
  EXPECT_EQ(units[1].first, "h.0");
  EXPECT_EQ(units[3].first, "h.2");
  EXPECT_EQ(units.back().first, "head");

  std::vector<std::string> from_units;
  std::set<const void*> seen;
  for (const auto& [unit, module] : units) {
    for (const auto& [key, tensor] : ptrain::models::state_dict(*module)) {
      from_units.push_back(unit == "stem" || unit == "head" ? key : unit + "." + key);
    }
    for (const auto& p : module->parameters()) {
      EXPECT_TRUE(seen.insert(p.unsafeGetTensorImpl()).second) << "a parameter of unit " << unit << " is in two units";
    }
  }
  std::vector<std::string> all;
  for (const auto& [key, tensor] : ptrain::models::state_dict(model)) all.push_back(key);
  EXPECT_EQ(from_units, all);
  EXPECT_EQ(seen.size(), model.parameters().size());
  EXPECT_TRUE(model.buffers().empty());

  torch::NoGradGuard no_grad;
  auto x = torch::randint(50, {2, 11}, torch::kInt64);  // shorter than seq_len
  const auto expected = model.forward(x);
  auto y = x;
  for (size_t i = 0; i < units.size(); ++i) x = model.forward_unit(i, x);
  EXPECT_TRUE(torch::equal(x, expected));
  // With the fused kernels, forward() leaves each block's last residual add to the next LayerNorm's kernel, where
  // forward_unit() adds it in the block: the same values.
  model.set_fused_kernels(true);
  const auto deferred = model.forward(y);
  for (size_t i = 0; i < units.size(); ++i) y = model.forward_unit(i, y);
  EXPECT_TRUE(torch::equal(deferred, y));
  EXPECT_THROW(model.forward_unit(units.size(), x), ptrain::Error);
}

// GPT-2's initialisation: N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 * layers)), zero biases,
// LayerNorms at weight 1 and bias 0.
TEST(Gpt, InitialisationFollowsGpt2) {
  torch::manual_seed(5);
  GptOptions o;
  o.vocab_size = 512;
  o.seq_len = 128;
  o.layers = 8;
  o.width = 128;
  o.heads = 4;
  const auto tensors = ptrain::models::state_dict(Gpt(o));
  const double residual = 0.02 / std::sqrt(16.0);
  int checked = 0;
  for (const auto& [name, t] : tensors) {
    const bool bias = name.size() > 5 && name.substr(name.size() - 5) == ".bias";
    if (name.find("ln_") != std::string::npos) {
      EXPECT_TRUE(torch::all(t == (bias ? 0.0 : 1.0)).item<bool>()) << name;
    } else if (bias) {
      EXPECT_EQ(t.abs().max().item<double>(), 0.0) << name;
    } else {
      const double want = name.find("c_proj.weight") != std::string::npos ? residual : 0.02;
      EXPECT_NEAR(t.std().item<double>() / want, 1.0, 0.05) << name;
      EXPECT_NEAR(t.mean().item<double>(), 0.0, want * 0.05) << name;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 2 + 8 * 12 + 3);
}

// The initial weights are drawn in parallel chunks: a seed gives the same model on any number of threads.
TEST(Gpt, InitialisationDependsOnTheSeedNotOnTheThreads) {
  GptOptions o = small_options();
  o.width = 768;  // c_fc holds 2.4M weights: three chunks
  const int threads = at::get_num_threads();
  const auto build = [&](int n, uint64_t seed) {
    at::set_num_threads(n);
    torch::manual_seed(seed);
    return ptrain::models::state_dict(Gpt(o));
  };
  const auto one = build(1, 7), two = build(2, 7), other = build(2, 8);
  at::set_num_threads(threads);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_TRUE(torch::equal(one[i].second, two[i].second)) << one[i].first;
    if (one[i].first.find("c_fc.weight") != std::string::npos) {
      EXPECT_FALSE(torch::equal(one[i].second, other[i].second)) << one[i].first;
      // Chunks have generators of their own: the second chunk does not repeat the first.
      const auto flat = one[i].second.view({-1});
      EXPECT_FALSE(torch::equal(flat.narrow(0, 0, 1000), flat.narrow(0, 1 << 20, 1000))) << one[i].first;
    }
  }
}

TEST(Gpt, RefusesImagesAndTooLongSequences) {
  Gpt model(small_options());
  const auto images = ptrain::testing::error_message<ptrain::Error>([&] { model.forward(torch::randn({2, 3, 8, 8})); });
  EXPECT_NE(images.find("token dataset"), std::string::npos) << images;
  const auto long_input = ptrain::testing::error_message<ptrain::Error>(
      [&] { model.forward(torch::zeros({1, 17}, torch::kInt64)); });
  EXPECT_NE(long_input.find("17 tokens"), std::string::npos) << long_input;
  EXPECT_NE(long_input.find("16 positions"), std::string::npos) << long_input;
}

TEST(GptZoo, NamedSizesOverridesAndReplicas) {
  using ptrain::models::make_model;
  for (const std::string name : {"gpt-tiny", "gpt-small", "gpt-medium", "gpt-large", "gpt-xl"}) {
    EXPECT_TRUE(ptrain::models::is_language_model(name));
    const auto names = ptrain::models::model_names();
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
  EXPECT_FALSE(ptrain::models::is_language_model("resnet18"));

  ptrain::models::ModelSpec spec{"gpt-tiny", 100, 0, 0, 32};
  auto tiny = std::dynamic_pointer_cast<Gpt>(make_model(spec));
  ASSERT_TRUE(tiny);
  EXPECT_EQ(tiny->name(), "gpt-tiny");
  EXPECT_EQ(tiny->options().layers, 2);
  EXPECT_EQ(tiny->options().width, 64);
  torch::NoGradGuard no_grad;
  EXPECT_EQ(tiny->forward(torch::zeros({3, 32}, torch::kInt64)).sizes().vec(), (std::vector<int64_t>{3, 32, 100}));

  spec.layers = 3;
  spec.width = 48;
  spec.heads = 6;
  auto shaped = std::dynamic_pointer_cast<Gpt>(make_model(spec));
  EXPECT_EQ(shaped->units().size(), 5u);
  EXPECT_EQ(shaped->options().width, 48);
  int64_t count = 0;
  for (const auto& p : shaped->parameters()) count += p.numel();
  EXPECT_EQ(count, ptrain::models::gpt_parameter_count(shaped->options()));

  shaped->set_activation_checkpointing(true);
  auto replica = std::dynamic_pointer_cast<Gpt>(shaped->make_replica());
  ASSERT_TRUE(replica);
  EXPECT_EQ(replica->options().layers, 3);
  EXPECT_EQ(replica->parameters().size(), shaped->parameters().size());

  spec.heads = 5;
  const auto message = ptrain::testing::error_message<ptrain::Error>([&] { make_model(spec); });
  EXPECT_NE(message.find("--gpt-width"), std::string::npos) << message;
}

// GPT-2 small's shape at its vocabulary and context: 124.4 M parameters with the head tied, and the head's
// 38.6 M more untied.
TEST(GptZoo, SmallHasGpt2SmallsParameterCount) {
  GptOptions o;
  o.vocab_size = 50257;
  o.seq_len = 1024;
  o.layers = 12;
  o.width = 768;
  o.heads = 12;
  EXPECT_EQ(ptrain::models::gpt_parameter_count(o) - 50257 * 768, 124439808);
}

}  // namespace

namespace {

GptOptions fp8_options(int64_t width, int64_t vocab) {
  GptOptions o;
  o.vocab_size = vocab;
  o.seq_len = 16;
  o.layers = 3;
  o.width = width;
  o.heads = 4;
  return o;
}

}  // namespace

TEST(GptFp8, CountsTheProjectionsInFp8AndTheHeadKeptUnlessAsked) {
  Gpt gpt(fp8_options(64, 256));
  const auto off = gpt.set_fp8_linear(false, {/*head=*/true});
  EXPECT_EQ(off.fp8, 0);
  EXPECT_EQ(off.kept, 0);
  // Four projections a block (c_attn, attn.c_proj, c_fc, mlp.c_proj); the head stays bf16 by default.
  const auto on = gpt.set_fp8_linear(true, {});
  EXPECT_EQ(on.fp8, 12);
  EXPECT_EQ(on.kept, 1);
  EXPECT_FALSE(on.head_in_fp8);
  EXPECT_NE(on.why.find("lm_head"), std::string::npos) << on.why;
  EXPECT_NE(on.why.find("--fp8-head"), std::string::npos) << on.why;
  const auto with_head = gpt.set_fp8_linear(true, {/*head=*/true});
  EXPECT_EQ(with_head.fp8, 13);
  EXPECT_EQ(with_head.kept, 0);
  EXPECT_TRUE(with_head.head_in_fp8);
  EXPECT_TRUE(with_head.why.empty()) << with_head.why;
  // Replicas (dp) run as their original.
  const auto replica = std::dynamic_pointer_cast<Gpt>(gpt.make_replica());
  ASSERT_TRUE(replica);
  EXPECT_EQ(replica->set_fp8_linear(true, {/*head=*/true}).fp8, 13);
}

TEST(GptFp8, FeaturesNotMultiplesOf16KeepBf16AndSaySo) {
  // Width 72: every projection has 72 input or output features (72 % 16 == 8).
  Gpt gpt(fp8_options(72, 256));
  const auto layers = gpt.set_fp8_linear(true, {/*head=*/true});
  EXPECT_EQ(layers.fp8, 0);
  EXPECT_EQ(layers.kept, 13);
  EXPECT_NE(layers.why.find("12 projections of width 72"), std::string::npos) << layers.why;
  EXPECT_NE(layers.why.find("multiples of 16"), std::string::npos) << layers.why;
  // An unaligned vocabulary without the fused kernels' padding keeps the head in bf16.
  Gpt odd_vocab(fp8_options(64, 50));
  const auto head = odd_vocab.set_fp8_linear(true, {/*head=*/true});
  EXPECT_EQ(head.fp8, 12);
  EXPECT_EQ(head.kept, 1);
  EXPECT_FALSE(head.head_in_fp8) << "asked for, but the shapes keep it in bf16";
  EXPECT_NE(head.why.find("lm_head: 50 x 64"), std::string::npos) << head.why;
  // With them the head comes padded to 128 rows, which FP8 takes.
  odd_vocab.set_fused_kernels(true);
  EXPECT_EQ(odd_vocab.set_fp8_linear(true, {/*head=*/true}).fp8, 13);
}

TEST(GptFp8, OnTheCpuTheForwardIsUnchanged) {
  // The FP8 products need a CUDA GPU: elsewhere every layer takes LibTorch's linear, bit for bit.
  torch::manual_seed(3);
  Gpt gpt(fp8_options(64, 256));
  const auto tokens = torch::randint(256, {2, 16}, torch::kLong);
  const auto plain = gpt.forward(tokens);
  gpt.set_fp8_linear(true, {/*head=*/true});
  EXPECT_TRUE(torch::equal(gpt.forward(tokens), plain));
}

TEST(ModelFp8, ModelsWithoutAnFp8PathKeepEveryLayerAndSayWhy) {
  ptrain::models::ModelSpec spec;
  spec.name = "resnet20";
  spec.num_classes = 10;
  spec.in_channels = 3;
  spec.image_size = 32;
  const auto resnet = ptrain::models::make_model(spec);
  int64_t convolutions = 0, linears = 0;
  for (const auto& m : resnet->modules(false)) {
    convolutions += m->as<torch::nn::Conv2dImpl>() != nullptr;
    linears += m->as<torch::nn::LinearImpl>() != nullptr;
  }
  EXPECT_GE(convolutions, 19);  // He et al.'s 6n + 1 (n = 3), and any projection shortcuts
  EXPECT_EQ(linears, 1);
  const auto layers = resnet->set_fp8_linear(true, {});
  EXPECT_EQ(layers.fp8, 0);
  EXPECT_EQ(layers.kept, convolutions + linears);
  EXPECT_NE(layers.why.find("resnet20"), std::string::npos) << layers.why;
  EXPECT_NE(layers.why.find("bf16"), std::string::npos) << layers.why;
  EXPECT_EQ(resnet->set_fp8_linear(false, {}).kept, 0);
}
