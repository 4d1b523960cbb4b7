// A whole dataset decoded into memory as uint8: CIFAR-10 is 150 MB and Fashion-MNIST 47 MB, small enough that
// decoding once beats decoding every epoch, and uint8 keeps host memory and host-to-device traffic 4x below
// float. Image folders too large for that (ImageNet) stream instead: their images stay files, decoded by the
// loader's workers as each batch needs them (an ImageSource; streaming_image_folder.h).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ptrain::data {

// Images decoded on demand, each to a square of one size.
class ImageSource {
 public:
  virtual ~ImageSource() = default;
  virtual int64_t channels() const = 0;
  virtual int64_t image_size() const = 0;  // side of the square images decode() makes
  // Decodes sample `index` into out (uint8, channels x image_size x image_size, contiguous): augmented, an
  // ImageNet-style random resized crop and horizontal flip drawn from `seed` alone (so the same seed gives
  // the same image on any thread); otherwise the image resized and centre-cropped. Thread-safe. Throws
  // ptrain::Error naming the file when it is unreadable or corrupt.
  virtual void decode(int64_t index, bool augment, uint64_t seed, uint8_t* out) const = 0;
  // Sample i of the result is sample indices[i] of this one.
  virtual std::shared_ptr<const ImageSource> subset(const std::vector<int64_t>& indices) const = 0;
  // How many threads the loader decodes with.
  virtual int threads() const = 0;
};

// Two forms: images (uint8 images, one class label each) and tokens (int64 sequences of T tokens, labelled
// with each position's next token, for language models). Both are indexed by sample on dimension 0.
struct Dataset {
  torch::Tensor images;  // images: uint8, N x C x H x W; tokens: int64, N x T. CPU, contiguous. Undefined when streamed
  torch::Tensor labels;  // images: int64, N; tokens: int64, N x T
  std::vector<std::string> classes;  // images only
  int64_t vocab_size = 0;            // tokens only: every token is in 0..vocab_size-1
  std::string description;
  std::shared_ptr<const ImageSource> source;  // streamed images: decoded per batch instead of held in images

  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
  bool is_tokens() const { return images.defined() && images.scalar_type() == torch::kInt64; }
  bool is_streamed() const { return source != nullptr; }
  // Images: the shape of one sample as the loader ships it.
  int64_t channels() const { return source ? source->channels() : images.size(1); }
  int64_t height() const { return source ? source->image_size() : images.size(2); }
  int64_t width() const { return source ? source->image_size() : images.size(3); }
};

// `limit` samples spread evenly over the dataset (sample floor(i * N / limit) for i = 0..limit-1), or the
// whole dataset when limit is 0 or not below N. Spread rather than the first ones: an image folder lists
// its samples class by class, and its first samples would all be of the first classes.
// bench/pytorch_reference.py picks the same samples.
inline Dataset spread_subset(Dataset dataset, int64_t limit) {
  const int64_t n = dataset.size();
  if (limit <= 0 || limit >= n) return dataset;
  const auto index = torch::arange(limit, torch::kInt64).mul(n).div(limit, "floor");
  if (dataset.source) {
    dataset.source = dataset.source->subset(std::vector<int64_t>(index.data_ptr<int64_t>(), index.data_ptr<int64_t>() + limit));
  } else {
    dataset.images = dataset.images.index_select(0, index);
  }
  dataset.labels = dataset.labels.index_select(0, index);
  return dataset;
}

}  // namespace ptrain::data
