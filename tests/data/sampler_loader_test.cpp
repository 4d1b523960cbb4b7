// The distributed sampler against torch.utils.data.DistributedSampler, and the loader's epoch guarantees.
#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <sstream>

#include "ptrain/core/rng.h"
#include "ptrain/data/loader.h"
#include "ptrain/data/sampler.h"
#include "test_util.h"

namespace ptrain::data {
namespace {

struct SamplerCase {
  int64_t n, world;
  bool shuffle;
  uint64_t seed;
  int64_t epoch;
  bool drop_last;
};

// torch.utils.data.DistributedSampler's indices: per case, per rank. One Python start for all cases.
std::vector<std::vector<std::vector<int64_t>>> torch_sampler(const std::vector<SamplerCase>& cases) {
  std::ostringstream args;
  for (const auto& c : cases)
    args << c.n << " " << c.world << " " << c.shuffle << " " << c.seed << " " << c.epoch << " " << c.drop_last << " ";
  std::istringstream lines(testing::oracle_output("data_sampler.py", args.str()));
  std::vector<std::vector<std::vector<int64_t>>> result(1);
  for (std::string line; std::getline(lines, line);) {
    if (line == "--") {
      result.emplace_back();
      continue;
    }
    std::istringstream values(line);
    result.back().emplace_back();
    for (int64_t v; values >> v;) result.back().back().push_back(v);
  }
  result.pop_back();
  return result;
}

TEST(DistributedSampler, MatchesTorchDistributedSampler) {
  // Even and uneven splits, padding that wraps more than once (2 samples, 5 ranks), no shuffle.
  const std::vector<SamplerCase> cases = {{12, 3, true, 0, 0, false}, {10, 3, true, 5, 2, false},
                                          {10, 3, true, 5, 2, true},   {2, 5, true, 1, 0, false},
                                          {11, 4, false, 0, 0, false}, {1000, 4, true, 42, 7, false}};
  const auto expected = torch_sampler(cases);
  ASSERT_EQ(expected.size(), cases.size());
  for (size_t k = 0; k < cases.size(); ++k) {
    const auto& c = cases[k];
    ASSERT_EQ(static_cast<int64_t>(expected[k].size()), c.world);
    for (int64_t rank = 0; rank < c.world; ++rank) {
      DistributedSampler sampler(c.n, rank, c.world, c.shuffle, c.seed, c.drop_last);
      EXPECT_EQ(sampler.indices(c.epoch), expected[k][rank]) << "n=" << c.n << " world=" << c.world << " rank=" << rank;
      EXPECT_EQ(sampler.num_samples(), static_cast<int64_t>(expected[k][rank].size()));
    }
  }
}

TEST(DistributedSampler, RanksPartitionTheEpochAndEpochsDiffer) {
  std::vector<int64_t> all;
  for (int64_t rank = 0; rank < 4; ++rank) {
    const auto mine = DistributedSampler(100, rank, 4, true, 9, false).indices(3);
    EXPECT_EQ(mine.size(), 25u);
    all.insert(all.end(), mine.begin(), mine.end());
  }
  std::sort(all.begin(), all.end());
  std::vector<int64_t> every(100);
  std::iota(every.begin(), every.end(), 0);
  EXPECT_EQ(all, every);

  const DistributedSampler sampler(100, 1, 4, true, 9, false);
  EXPECT_EQ(sampler.indices(3), DistributedSampler(100, 1, 4, true, 9, false).indices(3));
  EXPECT_NE(sampler.indices(3), sampler.indices(4));
  EXPECT_NE(sampler.indices(3), DistributedSampler(100, 1, 4, true, 10, false).indices(3));

  // Uneven: padding gives every rank 26, drop_last gives every rank 25 distinct ones.
  std::set<int64_t> kept;
  for (int64_t rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(DistributedSampler(103, rank, 4, true, 9, false).indices(0).size(), 26u);
    const auto mine = DistributedSampler(103, rank, 4, true, 9, true).indices(0);
    EXPECT_EQ(mine.size(), 25u);
    kept.insert(mine.begin(), mine.end());
  }
  EXPECT_EQ(kept.size(), 100u);
  testing::expect_error_mentioning([] { DistributedSampler(10, 4, 4, true, 0, false); }, {"rank 4"});
}

// Labels 0..n-1 identify the samples; pixels repeat them so that images and labels can be checked to travel together.
Dataset numbered_dataset(int64_t n) {
  Dataset ds;
  ds.labels = torch::arange(n, torch::kInt64);
  ds.images = ds.labels.remainder(256).to(torch::kUInt8).view({n, 1, 1, 1}).expand({n, 3, 4, 4}).contiguous();
  ds.description = "numbered";
  return ds;
}

std::vector<Batch> whole_epoch(Loader& loader, int64_t epoch, int64_t first_batch = 0) {
  loader.start_epoch(epoch, first_batch);
  std::vector<Batch> batches;
  while (auto batch = loader.next()) batches.push_back(*batch);
  EXPECT_FALSE(loader.next().has_value());  // stays finished
  return batches;
}

TEST(Loader, EverySampleOnceWithImagesMatchingLabels) {
  const auto ds = numbered_dataset(103);
  LoaderOptions options;
  options.batch_size = 10;
  options.seed = 4;
  Loader loader(ds, options);
  EXPECT_EQ(loader.batches_per_epoch(), 11);
  EXPECT_EQ(loader.samples_per_epoch(), 103);
  const auto batches = whole_epoch(loader, 0);
  ASSERT_EQ(batches.size(), 11u);
  std::vector<int64_t> seen;
  for (size_t b = 0; b < batches.size(); ++b) {
    EXPECT_EQ(batches[b].index, static_cast<int64_t>(b));
    EXPECT_EQ(batches[b].images.size(0), b + 1 < batches.size() ? 10 : 3);
    EXPECT_EQ(batches[b].images.scalar_type(), torch::kFloat);
    const auto expected_pixels = batches[b].labels.remainder(256).to(torch::kFloat).div(255).view({-1, 1, 1, 1});
    EXPECT_TRUE(torch::allclose(batches[b].images, expected_pixels.expand_as(batches[b].images)));
    for (int64_t i = 0; i < batches[b].labels.size(0); ++i) seen.push_back(batches[b].labels[i].item<int64_t>());
  }
  EXPECT_NE(seen.front(), 0);  // shuffled (probability 1/103 of a false alarm for this fixed seed: checked once)
  std::sort(seen.begin(), seen.end());
  std::vector<int64_t> every(103);
  std::iota(every.begin(), every.end(), 0);
  EXPECT_EQ(seen, every);
}

TEST(Loader, DropLastDropsTheShortBatch) {
  LoaderOptions options;
  options.batch_size = 10;
  options.drop_last = true;
  Loader loader(numbered_dataset(103), options);
  EXPECT_EQ(loader.batches_per_epoch(), 10);
  EXPECT_EQ(loader.samples_per_epoch(), 100);
  EXPECT_EQ(whole_epoch(loader, 0).size(), 10u);
}

void expect_same_batches(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].index, b[i].index);
    EXPECT_TRUE(torch::equal(a[i].labels, b[i].labels));
    EXPECT_TRUE(torch::equal(a[i].images, b[i].images));
  }
}

LoaderOptions augmenting_options() {
  LoaderOptions options;
  options.batch_size = 8;
  options.seed = 77;
  options.prefetch = 3;
  options.augment.random_crop = true;
  options.augment.crop_padding = 2;
  options.augment.horizontal_flip = true;
  options.augment.mean = {0.5f};
  options.augment.std = {0.25f};
  return options;
}

TEST(Loader, SameSeedSameBatchesAndResumeMidEpoch) {
  torch::manual_seed(3);
  Dataset ds;
  ds.images = torch::randint(0, 256, {50, 3, 6, 6}, torch::kUInt8);
  ds.labels = torch::arange(50, torch::kInt64);
  Loader first(ds, augmenting_options()), second(ds, augmenting_options());
  const auto a = whole_epoch(first, 2);
  expect_same_batches(a, whole_epoch(second, 2));

  // Augmentation is really applied and drawn from derive_seed(seed, {epoch, batch, rank}).
  const auto& batch3 = a[3];
  const auto draw = draw_augmentation(8, augmenting_options().augment, derive_seed(77, {2, 3, 0}));
  const auto expected = augment_batch(ds.images.index_select(0, batch3.labels), augmenting_options().augment, &draw);
  EXPECT_TRUE(torch::equal(batch3.images, expected));
  EXPECT_FALSE(torch::equal(batch3.images, augment_batch(ds.images.index_select(0, batch3.labels),
                                                         augmenting_options().augment, nullptr)));

  Loader resumed(ds, augmenting_options());
  expect_same_batches(std::vector<Batch>(a.begin() + 4, a.end()), whole_epoch(resumed, 2, 4));
  EXPECT_TRUE(whole_epoch(resumed, 2, resumed.batches_per_epoch()).empty());

  // Another epoch: another order and other draws.
  const auto other = whole_epoch(first, 3);
  EXPECT_FALSE(torch::equal(other[0].labels, a[0].labels));
}

TEST(Loader, EvalModeDoesNotAugment) {
  torch::manual_seed(4);
  Dataset ds;
  ds.images = torch::randint(0, 256, {20, 3, 6, 6}, torch::kUInt8);
  ds.labels = torch::arange(20, torch::kInt64);
  auto options = augmenting_options();
  options.train = false;
  options.shuffle = false;
  Loader loader(ds, options);
  const auto batches = whole_epoch(loader, 0);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_TRUE(torch::equal(batches[0].images, augment_batch(ds.images.slice(0, 0, 8), options.augment, nullptr)));
  EXPECT_TRUE(torch::equal(batches[2].labels, torch::arange(16, 20, torch::kInt64)));
}

TEST(Loader, RanksSplitTheEpochLikeTheSampler) {
  const auto ds = numbered_dataset(50);
  std::vector<int64_t> all;
  for (int64_t rank = 0; rank < 3; ++rank) {
    LoaderOptions options;
    options.batch_size = 4;
    options.seed = 8;
    options.rank = rank;
    options.world_size = 3;
    Loader loader(ds, options);
    EXPECT_EQ(loader.samples_per_epoch(), 17);  // 50 padded to 51
    EXPECT_EQ(loader.batches_per_epoch(), 5);
    std::vector<int64_t> mine;
    for (const auto& batch : whole_epoch(loader, 1))
      for (int64_t i = 0; i < batch.labels.size(0); ++i) mine.push_back(batch.labels[i].item<int64_t>());
    EXPECT_EQ(mine, DistributedSampler(50, rank, 3, true, 8, false).indices(1));
    all.insert(all.end(), mine.begin(), mine.end());
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), 50u);
  EXPECT_EQ(all.size(), 51u);
}

TEST(Loader, StoppingEarlyOrRestartingDoesNotHang) {
  const auto ds = numbered_dataset(5000);
  LoaderOptions options;
  options.batch_size = 16;
  options.prefetch = 2;
  {
    Loader loader(ds, options);
    loader.start_epoch(0);
    ASSERT_TRUE(loader.next().has_value());
    // The worker is now blocked on a full queue; the destructor must wake and join it.
  }
  {
    Loader loader(ds, options);
    loader.start_epoch(0);  // never consumed at all
  }
  Loader loader(ds, options);
  loader.start_epoch(0);
  loader.next();
  loader.start_epoch(1, 5);  // restart while the worker waits
  const auto batch = loader.next();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->index, 5);
}

TEST(Loader, BadUseIsReported) {
  const auto ds = numbered_dataset(10);
  LoaderOptions options;
  options.batch_size = 4;
  Loader loader(ds, options);
  testing::expect_error_mentioning([&] { loader.next(); }, {"start_epoch"});
  testing::expect_error_mentioning([&] { loader.start_epoch(0, 4); }, {"first_batch 4", "0..3"});
  options.batch_size = 0;
  testing::expect_error_mentioning([&] { Loader bad(ds, options); }, {"batch_size"});
  options.batch_size = 4;
  options.device = torch::Device(torch::kCUDA, 0);
#if !PTRAIN_WITH_CUDA
  testing::expect_error_mentioning([&] { Loader bad(ds, options); }, {"cuda", "without CUDA"});
#endif
  // Errors in the consumer's augmentation surface from next().
  options.device = torch::kCPU;
  options.augment.mean = {0.1f, 0.2f};
  options.augment.std = {0.1f, 0.2f};
  Loader misconfigured(ds, options);
  misconfigured.start_epoch(0);
  testing::expect_error_mentioning([&] { misconfigured.next(); }, {"mean", "3 channels"});
}

}  // namespace
}  // namespace ptrain::data
