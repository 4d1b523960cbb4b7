#include <gtest/gtest.h>

#include <set>

#include "ptrain/core/rng.h"

TEST(DeriveSeed, SameInputsSameSeedAndNeighboursDiffer) {
  EXPECT_EQ(ptrain::derive_seed(7, {1, 2}), ptrain::derive_seed(7, {1, 2}));
  std::set<uint64_t> seen;
  for (uint64_t epoch = 0; epoch < 8; ++epoch)
    for (uint64_t step = 0; step < 64; ++step) seen.insert(ptrain::derive_seed(7, {epoch, step}));
  EXPECT_EQ(seen.size(), 8u * 64u);
  EXPECT_NE(ptrain::derive_seed(7, {1, 2}), ptrain::derive_seed(7, {2, 1}));
  EXPECT_NE(ptrain::derive_seed(7, {1}), ptrain::derive_seed(8, {1}));
}
