#include "ptrain/data/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "ptrain/core/error.h"

namespace ptrain::data {

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t rank, int64_t world_size, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size), rank_(rank), world_size_(world_size), shuffle_(shuffle), seed_(seed) {
  check(world_size >= 1, "sampler: world_size must be >= 1, got " + std::to_string(world_size));
  check(rank >= 0 && rank < world_size,
        "sampler: rank " + std::to_string(rank) + " outside 0.." + std::to_string(world_size - 1));
  check(dataset_size >= 0, "sampler: negative dataset size " + std::to_string(dataset_size));
  num_samples_ = drop_last ? dataset_size / world_size : (dataset_size + world_size - 1) / world_size;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(dataset_size_));
  if (shuffle_) {
    auto gen = at::detail::createCPUGenerator(seed_ + static_cast<uint64_t>(epoch));
    auto perm = torch::randperm(dataset_size_, gen, torch::kInt64);
    std::copy(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + dataset_size_, order.begin());
  } else {
    for (int64_t i = 0; i < dataset_size_; ++i) order[i] = i;
  }
  const int64_t total = num_samples_ * world_size_;
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  // Position p of the padded order is order[p mod N]: wrapping, as PyTorch pads with the order's own start.
  for (int64_t p = rank_; p < total; p += world_size_) mine.push_back(order[p % dataset_size_]);
  return mine;
}

}  // namespace ptrain::data
