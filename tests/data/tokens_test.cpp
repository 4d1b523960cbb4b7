// Token datasets: synthetic Markov-chain sequences and byte-level text, their splits and errors, and the
// loader passing tokens through as int64.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "ptrain/data/loader.h"
#include "ptrain/data/registry.h"
#include "ptrain/data/tokens.h"
#include "test_util.h"

namespace ptrain::data {
namespace {

void expect_labels_are_next_tokens(const Dataset& ds) {
  ASSERT_TRUE(ds.is_tokens());
  ASSERT_EQ(ds.images.dim(), 2);
  ASSERT_EQ(ds.labels.sizes(), ds.images.sizes());
  EXPECT_EQ(ds.labels.scalar_type(), torch::kInt64);
  const int64_t t = ds.images.size(1);
  EXPECT_TRUE(torch::equal(ds.labels.narrow(1, 0, t - 1), ds.images.narrow(1, 1, t - 1)));
}

TEST(SyntheticTokens, ShapesLabelsAndDeterminism) {
  const auto a = make_synthetic_tokens(300, 24, 40, 1);
  ASSERT_EQ(a.images.sizes().vec(), (std::vector<int64_t>{300, 24}));
  EXPECT_EQ(a.size(), 300);
  EXPECT_EQ(a.vocab_size, 40);
  EXPECT_TRUE(a.classes.empty());
  expect_labels_are_next_tokens(a);
  EXPECT_GE(a.images.min().item<int64_t>(), 0);
  EXPECT_LT(std::max(a.images.max().item<int64_t>(), a.labels.max().item<int64_t>()), 40);
  EXPECT_TRUE(torch::equal(a.images, make_synthetic_tokens(300, 24, 40, 1).images));
  EXPECT_FALSE(torch::equal(a.images, make_synthetic_tokens(300, 24, 40, 2).images));
}

// Every token has at most four successors, the most frequent followed about 60% of the time: a structure a
// model can learn, far from uniform; and the train and test splits share it.
TEST(SyntheticTokens, FollowsOneFixedMarkovChain) {
  const auto train = open_dataset({"synthetic-tokens", "2000:32:16"}, true, 1);
  const auto test = open_dataset({"synthetic-tokens", "2000:32:16"}, false, 1);
  ASSERT_EQ(train.size(), 2000);
  ASSERT_EQ(test.size(), 400);
  EXPECT_FALSE(torch::equal(train.images.narrow(0, 0, 400), test.images));
  std::map<int64_t, std::map<int64_t, int64_t>> counts;  // token -> successor -> count (both splits)
  for (const Dataset* ds : {&train, &test}) {
    const auto x = ds->images.flatten(), y = ds->labels.flatten();
    const auto xs = x.accessor<int64_t, 1>(), ys = y.accessor<int64_t, 1>();
    for (int64_t i = 0; i < x.size(0); ++i) ++counts[xs[i]][ys[i]];
  }
  EXPECT_EQ(counts.size(), 16u);
  double top_share = 0;
  for (const auto& [token, successors] : counts) {
    EXPECT_LE(successors.size(), 4u) << "token " << token;
    int64_t total = 0, top = 0;
    for (const auto& [next, n] : successors) {
      total += n;
      top = std::max(top, n);
    }
    top_share += static_cast<double>(top) / static_cast<double>(total) / 16.0;
  }
  // 0.6 when a token's four successors differ; more when two coincide.
  EXPECT_GT(top_share, 0.55);
  EXPECT_LT(top_share, 0.8);
}

TEST(SyntheticTokens, SeqLenReplacesThePathsAndDefaultsApply) {
  DataSpec spec{"synthetic-tokens", "50:8:10", 12};
  EXPECT_EQ(open_dataset(spec, true, 1).images.sizes().vec(), (std::vector<int64_t>{50, 12}));
  const auto fallback = open_dataset({"synthetic-tokens", ""}, false, 1);
  EXPECT_EQ(fallback.images.sizes().vec(), (std::vector<int64_t>{4000, 64}));
  EXPECT_EQ(fallback.vocab_size, 256);
}

TEST(SyntheticTokens, BadSpecsNameTheFlagAndTheFormat) {
  testing::expect_error_mentioning([] { open_dataset({"synthetic-tokens", "100:16"}, true, 1); },
                                   {"--data-path", "'100:16'", "N:T:V"});
  testing::expect_error_mentioning([] { open_dataset({"synthetic-tokens", "100:x:5"}, true, 1); },
                                   {"--data-path", "'x'", "N:T:V"});
  testing::expect_error_mentioning([] { open_dataset({"synthetic-tokens", "100:16:0"}, true, 1); },
                                   {"--data-path", "V"});
  testing::expect_error_mentioning([] { open_dataset({"synthetic-tokens", "100:16:1"}, true, 1); },
                                   {"--data-path", "at least 2"});
}

TEST(TextTokens, BytesInWindowsWithTheLastTenthForTest) {
  testing::ScratchDir dir;
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 1000; ++i) bytes.push_back(static_cast<uint8_t>((i * 7 + i / 256) % 256));
  testing::write_bytes(dir / "corpus.txt", bytes);
  const auto train = open_dataset({"text", dir / "corpus.txt", 10}, true, 1);
  const auto test = open_dataset({"text", dir / "corpus.txt", 10}, false, 1);
  EXPECT_EQ(train.vocab_size, 256);
  // 900 train bytes: windows of 11 every 10 bytes -> 89; 100 test bytes -> 9.
  ASSERT_EQ(train.images.sizes().vec(), (std::vector<int64_t>{89, 10}));
  ASSERT_EQ(test.images.sizes().vec(), (std::vector<int64_t>{9, 10}));
  expect_labels_are_next_tokens(train);
  expect_labels_are_next_tokens(test);
  for (const int64_t w : {0, 5, 88}) {
    for (int64_t j = 0; j < 10; ++j) {
      EXPECT_EQ(train.images[w][j].item<int64_t>(), bytes[w * 10 + j]);
      EXPECT_EQ(train.labels[w][j].item<int64_t>(), bytes[w * 10 + j + 1]);
    }
  }
  EXPECT_EQ(test.images[0][0].item<int64_t>(), bytes[900]);
  EXPECT_EQ(test.labels[8][9].item<int64_t>(), bytes[990]);
  // The default length.
  EXPECT_EQ(open_dataset({"text", dir / "corpus.txt"}, true, 1).images.size(1), 256);
}

TEST(TextTokens, MissingOrShortFilesAreNamed) {
  testing::ScratchDir dir;
  testing::expect_error_mentioning([&] { open_dataset({"text", dir / "absent.txt", 8}, true, 1); },
                                   {"--data-path", "absent.txt", "no such file"});
  testing::expect_error_mentioning([&] { open_dataset({"text", ""}, true, 1); }, {"--data-path"});
  testing::write_bytes(dir / "short.txt", std::vector<uint8_t>(50, 'a'));
  testing::expect_error_mentioning([&] { open_dataset({"text", dir / "short.txt", 8}, false, 1); },
                                   {"short.txt", "50 bytes", "test", "--seq-len"});
  EXPECT_EQ(open_dataset({"text", dir / "short.txt", 8}, true, 1).size(), 5);
}

// Tokens leave the loader as they are: int64, not augmented, not cast to the compute dtype.
// The PyTorch reference (bench/pytorch_reference.py) builds the same token datasets, so that both frameworks
// train on the same tokens: its first sequences of each split, read from its own code, are ptrain's.
void expect_reference_gives(const Dataset& train, const Dataset& test, const std::string& arguments, int64_t rows) {
  std::istringstream out(testing::oracle_output("reference_tokens.py", arguments + " " + std::to_string(rows)));
  for (const Dataset* ds : {&train, &test}) {
    std::string split;
    int64_t n = 0, t = 0, vocab = 0;
    ASSERT_TRUE(out >> split >> n >> t >> vocab) << arguments;
    EXPECT_EQ(split, ds == &train ? "train" : "test");
    EXPECT_EQ(n, ds->size()) << split;
    EXPECT_EQ(t, ds->images.size(1)) << split;
    EXPECT_EQ(vocab, ds->vocab_size) << split;
    for (const torch::Tensor* tokens : {&ds->images, &ds->labels}) {
      auto python = torch::empty({std::min(rows, n), t}, torch::kInt64);
      auto* at = python.data_ptr<int64_t>();
      for (int64_t i = 0; i < python.numel(); ++i) ASSERT_TRUE(out >> at[i]) << split << " token " << i;
      EXPECT_TRUE(torch::equal(python, tokens->narrow(0, 0, python.size(0))))
          << split << (tokens == &ds->images ? " inputs" : " labels") << " differ for " << arguments;
    }
  }
}

TEST(SyntheticTokens, ThePytorchReferenceGeneratesTheSameSequences) {
  expect_reference_gives(open_synthetic_tokens("40:24:37", 0, true), open_synthetic_tokens("40:24:37", 0, false),
                         "synthetic-tokens 40:24:37 0", 5);
  // GPT-2's vocabulary, and --seq-len replacing the spec's T, as the speed suite trains.
  expect_reference_gives(open_synthetic_tokens("20:99:50257", 33, true), open_synthetic_tokens("20:99:50257", 33, false),
                         "synthetic-tokens 20:99:50257 33", 3);
}

TEST(TextTokens, ThePytorchReferenceCutsTheSameWindows) {
  testing::ScratchDir dir;
  std::string text;
  for (int i = 0; i < 60; ++i) text += "line " + std::to_string(i * 7919 % 1000) + " of the text\n";
  std::ofstream(dir / "corpus.txt") << text;
  expect_reference_gives(load_text_tokens(dir / "corpus.txt", 16, true), load_text_tokens(dir / "corpus.txt", 16, false),
                         "text " + (dir / "corpus.txt") + " 16", 4);
}

TEST(TokenLoader, BatchesStayInt64WithTheirLabels) {
  const auto ds = make_synthetic_tokens(37, 6, 20, 3);
  LoaderOptions options;
  options.batch_size = 8;
  options.seed = 2;
  options.augment.out_dtype = torch::kHalf;
  options.augment.mean = {0.5f};
  options.augment.std = {0.5f};
  options.augment.random_crop = true;
  Loader loader(ds, options);
  loader.start_epoch(0);
  int64_t seen = 0;
  while (auto batch = loader.next()) {
    ASSERT_EQ(batch->images.scalar_type(), torch::kInt64);
    ASSERT_EQ(batch->images.dim(), 2);
    EXPECT_EQ(batch->images.size(1), 6);
    EXPECT_EQ(batch->labels.sizes(), batch->images.sizes());
    EXPECT_TRUE(torch::equal(batch->labels.narrow(1, 0, 5), batch->images.narrow(1, 1, 5)));
    // Each row is one of the dataset's rows.
    const auto row = batch->images[0];
    EXPECT_TRUE(torch::any((ds.images == row).all(1)).item<bool>());
    seen += batch->images.size(0);
  }
  EXPECT_EQ(seen, 37);
}

TEST(TokenLoader, RefusesLabelsOfAnotherShape) {
  auto ds = make_synthetic_tokens(10, 6, 20, 3);
  ds.labels = ds.labels.select(1, 0).contiguous();
  testing::expect_error_mentioning([&] { Loader(ds, LoaderOptions{}); }, {"int64 N x T"});
}

}  // namespace
}  // namespace ptrain::data
