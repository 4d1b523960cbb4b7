// Which samples each rank of a data-parallel run sees in an epoch.
#pragma once

#include <cstdint>
#include <vector>

namespace ptrain::data {

// torch.utils.data.DistributedSampler's semantics: with shuffle, the epoch's order is ATen's randperm from a CPU
// generator seeded with seed + epoch, the same call PyTorch makes, so the indices equal PyTorch's for the same
// LibTorch release. Without drop_last the order is padded by wrapping around so that every rank gets the same
// count (ranks that disagree on the step count would hang in a collective); with drop_last it is cut to a
// multiple of world_size. Rank r takes positions r, r + W, r + 2W, ...
class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int64_t rank, int64_t world_size, bool shuffle, uint64_t seed,
                     bool drop_last);

  std::vector<int64_t> indices(int64_t epoch) const;
  int64_t num_samples() const { return num_samples_; }

 private:
  int64_t dataset_size_, rank_, world_size_;
  bool shuffle_;
  uint64_t seed_;
  int64_t num_samples_;
};

}  // namespace ptrain::data
