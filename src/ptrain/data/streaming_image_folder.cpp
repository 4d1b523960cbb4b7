#include "ptrain/data/streaming_image_folder.h"

#include <cmath>
#include <filesystem>
#include <random>

#include "ptrain/core/error.h"
#include "ptrain/data/image_folder.h"
#include "ptrain/data/jpeg_decode.h"

namespace ptrain::data {

namespace {

namespace fs = std::filesystem;

struct Crop {
  double x = 0, y = 0, width = 0, height = 0;
};

// torchvision 0.14's RandomResizedCrop.get_params(scale=(0.08, 1), ratio=(3/4, 4/3)), on our generator.
Crop random_resized_crop(int64_t width, int64_t height, std::mt19937_64& rng) {
  const double area = static_cast<double>(width) * static_cast<double>(height);
  std::uniform_real_distribution<double> scale(0.08, 1.0);
  std::uniform_real_distribution<double> log_ratio(std::log(3.0 / 4.0), std::log(4.0 / 3.0));
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * scale(rng);
    const double ratio = std::exp(log_ratio(rng));
    const auto w = static_cast<int64_t>(std::lround(std::sqrt(target * ratio)));
    const auto h = static_cast<int64_t>(std::lround(std::sqrt(target / ratio)));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int64_t top = std::uniform_int_distribution<int64_t>(0, height - h)(rng);
      const int64_t left = std::uniform_int_distribution<int64_t>(0, width - w)(rng);
      return {static_cast<double>(left), static_cast<double>(top), static_cast<double>(w), static_cast<double>(h)};
    }
  }
  // The fallback: the whole image, cut to the nearest allowed aspect ratio, centred.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  double w = static_cast<double>(width), h = static_cast<double>(height);
  if (in_ratio < 3.0 / 4.0) {
    h = std::round(w / (3.0 / 4.0));
  } else if (in_ratio > 4.0 / 3.0) {
    w = std::round(h * (4.0 / 3.0));
  }
  return {std::floor((static_cast<double>(width) - w) / 2), std::floor((static_cast<double>(height) - h) / 2), w, h};
}

// Resize(size / fraction) then CenterCrop(size), as one crop of the original image.
Crop centre_crop(int64_t width, int64_t height, int64_t size, double fraction) {
  const double shorter = static_cast<double>(std::min(width, height));
  const double resized_shorter = std::round(static_cast<double>(size) / fraction);
  const double side = static_cast<double>(size) * shorter / resized_shorter;
  return {(static_cast<double>(width) - side) / 2, (static_cast<double>(height) - side) / 2, side, side};
}

struct Files {
  std::vector<fs::path> paths;
};

class StreamingFolder final : public ImageSource {
 public:
  StreamingFolder(std::shared_ptr<const Files> files, std::vector<int64_t> index, const StreamingOptions& options)
      : files_(std::move(files)), index_(std::move(index)), options_(options) {}

  int64_t channels() const override { return 3; }
  int64_t image_size() const override { return options_.image_size; }
  int threads() const override { return options_.threads; }

  void decode(int64_t i, bool augment, uint64_t seed, uint8_t* out) const override {
    const fs::path& path = files_->paths.at(static_cast<size_t>(index_.at(static_cast<size_t>(i))));
    std::mt19937_64 rng(seed);
    bool flip = false;
    const int64_t size = options_.image_size;
    const auto region_for = [&](int64_t width, int64_t height) {
      check(width > 0 && height > 0, path.string() + ": image has no pixels");
      const Crop c = augment ? random_resized_crop(width, height, rng) : centre_crop(width, height, size, options_.eval_crop_fraction);
      if (augment) flip = std::uniform_real_distribution<double>(0.0, 1.0)(rng) < 0.5;
      DecodeRequest r;
      r.x = c.x;
      r.y = c.y;
      r.width = c.width;
      r.height = c.height;
      r.min_width = size;
      r.min_height = size;
      return r;
    };
    // The decoding thread's buffers, reused from image to image.
    thread_local ScaledImage decoded;
    decode_for_region(path, region_for, decoded);
    const auto& r = decoded.request;
    resample_region(decoded.image, r.x * decoded.scale_x - static_cast<double>(decoded.origin_x),
                    r.y * decoded.scale_y - static_cast<double>(decoded.origin_y), r.width * decoded.scale_x,
                    r.height * decoded.scale_y, size, flip, out);
  }

  std::shared_ptr<const ImageSource> subset(const std::vector<int64_t>& indices) const override {
    std::vector<int64_t> index;
    index.reserve(indices.size());
    for (const int64_t i : indices) index.push_back(index_.at(static_cast<size_t>(i)));
    return std::make_shared<StreamingFolder>(files_, std::move(index), options_);
  }

 private:
  std::shared_ptr<const Files> files_;
  std::vector<int64_t> index_;  // sample -> file
  StreamingOptions options_;
};

}  // namespace

Dataset open_streaming_image_folder(const std::string& root, const StreamingOptions& options) {
  check(options.image_size > 0, root + ": streaming an image folder needs the size to crop its images to (--image-size)");
  check(options.threads >= 1, "--loader-threads must be at least 1");
  ImageFolderListing listing = list_image_folder(root);
  auto files = std::make_shared<Files>();
  files->paths = std::move(listing.files);
  const auto n = static_cast<int64_t>(files->paths.size());
  std::vector<int64_t> index(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) index[static_cast<size_t>(i)] = i;
  Dataset ds;
  ds.labels = torch::tensor(listing.labels, torch::kInt64);
  ds.classes = std::move(listing.classes);
  ds.source = std::make_shared<StreamingFolder>(std::move(files), std::move(index), options);
  ds.description = "image folder " + root + " (" + std::to_string(n) + " images, streamed at 3x" +
                   std::to_string(options.image_size) + "x" + std::to_string(options.image_size) + ")";
  return ds;
}

std::string choose_image_loading(const std::string& train_root) {
  const ImageFolderListing listing = list_image_folder(train_root);
  int64_t bytes = 0;
  for (const auto& f : listing.files) bytes += static_cast<int64_t>(fs::file_size(f));
  if (bytes > kAutoStreamBytes) return "stream";
  const size_t n = listing.files.size();
  const size_t samples = std::min<size_t>(n, 16);
  const auto first = image_dimensions(listing.files.front());
  for (size_t k = 1; k < samples; ++k) {
    if (image_dimensions(listing.files[k * n / samples]) != first) return "stream";
  }
  return "memory";
}

}  // namespace ptrain::data
