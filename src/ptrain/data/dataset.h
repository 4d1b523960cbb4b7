// A whole dataset decoded into memory as uint8: CIFAR-10 is 150 MB and Fashion-MNIST 47 MB, small enough that
// decoding once beats decoding every epoch, and uint8 keeps host memory and host-to-device traffic 4x below
// float. Streaming decode for ImageNet-scale folders (which would not fit) is not done.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ptrain::data {

// Two forms: images (uint8 images, one class label each) and tokens (int64 sequences of T tokens, labelled
// with each position's next token, for language models). Both are indexed by sample on dimension 0.
struct Dataset {
  torch::Tensor images;  // images: uint8, N x C x H x W; tokens: int64, N x T. CPU, contiguous
  torch::Tensor labels;  // images: int64, N; tokens: int64, N x T
  std::vector<std::string> classes;  // images only
  int64_t vocab_size = 0;            // tokens only: every token is in 0..vocab_size-1
  std::string description;

  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
  bool is_tokens() const { return images.defined() && images.scalar_type() == torch::kInt64; }
};

// `limit` samples spread evenly over the dataset (sample floor(i * N / limit) for i = 0..limit-1), or the
// whole dataset when limit is 0 or not below N. Spread rather than the first ones: an image folder lists
// its samples class by class, and its first samples would all be of the first classes.
// bench/pytorch_reference.py picks the same samples.
inline Dataset spread_subset(Dataset dataset, int64_t limit) {
  const int64_t n = dataset.size();
  if (limit <= 0 || limit >= n) return dataset;
  const auto index = torch::arange(limit, torch::kInt64).mul(n).div(limit, "floor");
  dataset.images = dataset.images.index_select(0, index);
  dataset.labels = dataset.labels.index_select(0, index);
  return dataset;
}

}  // namespace ptrain::data
