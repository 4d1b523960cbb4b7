// The streamed image folder: evaluation crops equal torchvision's Resize + CenterCrop (PIL) on images of
// any size and aspect ratio, PNG and JPEG (the JPEGs decoded at a reduced DCT scale); training crops and
// flips are a function of the seed alone, so the loader's batches are the same on one decode thread and
// on three; a corrupt file fails the batch naming the file.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "ptrain/core/error.h"
#include "ptrain/data/jpeg_decode.h"
#include "ptrain/data/loader.h"
#include "ptrain/data/registry.h"
#include "ptrain/data/streaming_image_folder.h"
#include "test_util.h"

namespace ptrain::data {
namespace {

using testing::ScratchDir;

constexpr int64_t kSize = 32;

Dataset streamed(const std::string& root, int threads = 2) {
  StreamingOptions options;
  options.image_size = kSize;
  options.threads = threads;
  return open_streaming_image_folder(root, options);
}

torch::Tensor decode(const Dataset& ds, int64_t i, bool augment, uint64_t seed) {
  auto out = torch::empty({3, kSize, kSize}, torch::kUInt8);
  ds.source->decode(i, augment, seed, out.data_ptr<uint8_t>());
  return out;
}

std::string read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

torch::Tensor image_at(const std::string& raw, int64_t i) {
  return torch::from_blob(const_cast<char*>(raw.data()) + i * 3 * kSize * kSize, {3, kSize, kSize}, torch::kUInt8)
      .to(torch::kFloat);
}

TEST(StreamingImageFolder, EvaluationCropsAreTorchvisionsResizeAndCenterCropInOneResample) {
  const ScratchDir dir;
  testing::run_oracle("data_streaming.py", "make " + dir.path().string());
  testing::run_oracle("data_streaming.py", "eval " + dir.path().string() + " test " + std::to_string(kSize) + " " + (dir / "eval"));
  const auto ds = streamed((dir.path() / "test").string());
  ASSERT_EQ(ds.size(), 12);
  EXPECT_EQ(ds.classes, (std::vector<std::string>{"c0", "c1"}));
  const std::string box = read_raw(dir / "eval.box"), torchvision = read_raw(dir / "eval.torchvision");
  ASSERT_EQ(box.size(), static_cast<size_t>(12 * 3 * kSize * kSize));
  ASSERT_EQ(torchvision.size(), box.size());
  for (int64_t i = 0; i < ds.size(); ++i) {
    const auto ours = decode(ds, i, false, 0).to(torch::kFloat);
    // PIL's resize of the same box: PNGs (even indices) decoded as PIL decodes them agree up to rounding;
    // JPEGs are decoded at a reduced DCT scale, another downscaling filter.
    const double box_error = (ours - image_at(box, i)).abs().mean().item<double>();
    EXPECT_LT(box_error, i % 2 == 0 ? 0.6 : 3.0) << "image " << i;
    // torchvision resizes the whole image, then cuts the centre at whole pixels: the same region, a
    // fraction of a pixel apart.
    const double torchvision_error = (ours - image_at(torchvision, i)).abs().mean().item<double>();
    EXPECT_LT(torchvision_error, 7.0) << "image " << i;
  }
}

TEST(StreamingImageFolder, TrainingCropsAreAFunctionOfTheSeed) {
  const ScratchDir dir;
  testing::run_oracle("data_streaming.py", "make " + dir.path().string());
  const auto ds = streamed((dir.path() / "train").string());
  const auto a = decode(ds, 3, true, 11), b = decode(ds, 3, true, 11), c = decode(ds, 3, true, 12);
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_FALSE(torch::equal(a, c));
  EXPECT_FALSE(torch::equal(a, decode(ds, 3, false, 11)));
  // Flips come up about half the time: a horizontal ramp reads brighter on the right unless flipped.
  RgbImage ramp;
  ramp.width = 64;
  ramp.height = 48;
  ramp.rgb.resize(64 * 48 * 3);
  for (int64_t y = 0; y < 48; ++y)
    for (int64_t x = 0; x < 64; ++x)
      for (int64_t ch = 0; ch < 3; ++ch) ramp.rgb[(y * 64 + x) * 3 + ch] = static_cast<uint8_t>(x * 4);
  auto out = torch::empty({3, kSize, kSize}, torch::kUInt8);
  resample_region(ramp, 0, 0, 64, 48, kSize, /*flip=*/false, out.data_ptr<uint8_t>());
  EXPECT_LT(out[0][0][0].item<int>(), out[0][0][kSize - 1].item<int>());
  resample_region(ramp, 0, 0, 64, 48, kSize, /*flip=*/true, out.data_ptr<uint8_t>());
  EXPECT_GT(out[0][0][0].item<int>(), out[0][0][kSize - 1].item<int>());
}

// Decoding only the crop's window (rows skipped above, columns cropped, rows below entropy-decoded only)
// must give the resampler the very pixels of the whole frame: the same bytes out, whatever the chroma
// layout (fancy upsampling of 4:2:0 and 4:2:2 chroma reads neighbours across the window's edge), for crops
// anywhere, at every DCT scale.
TEST(StreamingImageFolder, WindowDecodeGivesTheWholeFramesPixels) {
  const ScratchDir dir;
  testing::run_oracle("data_streaming.py", "jpegs " + dir.path().string());
  std::mt19937_64 rng(5);
  int files = 0, windowed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    ++files;
    const auto [width, height] = image_dimensions(entry.path());
    for (int trial = 0; trial < 24; ++trial) {
      const int64_t out_size = std::vector<int64_t>{16, 40, 64, 112}[trial % 4];
      std::uniform_real_distribution<double> unit(0.0, 1.0);
      const double w = std::max(4.0, unit(rng) * width), h = std::max(4.0, unit(rng) * height);
      const double x = unit(rng) * (width - w), y = unit(rng) * (height - h);
      torch::Tensor outputs[2];
      for (const bool whole : {false, true}) {
        const ScaledImage decoded = decode_for_region(entry.path(), [&](int64_t, int64_t) {
          return DecodeRequest{x, y, w, h, out_size, out_size, whole};
        });
        if (!whole && decoded.image.width * decoded.image.height <
                          std::lround(width * decoded.scale_x) * std::lround(height * decoded.scale_y)) {
          ++windowed;
        }
        auto out = torch::empty({3, out_size, out_size}, torch::kUInt8);
        resample_region(decoded.image, x * decoded.scale_x - static_cast<double>(decoded.origin_x),
                        y * decoded.scale_y - static_cast<double>(decoded.origin_y), w * decoded.scale_x,
                        h * decoded.scale_y, out_size, trial % 2 == 1, out.data_ptr<uint8_t>());
        outputs[whole ? 1 : 0] = out;
      }
      EXPECT_TRUE(torch::equal(outputs[0], outputs[1]))
          << entry.path().filename() << " crop " << x << "," << y << " " << w << "x" << h << " to " << out_size
          << ": max difference " << (outputs[0].to(torch::kInt) - outputs[1].to(torch::kInt)).abs().max().item<int>();
    }
  }
  EXPECT_EQ(files, 15);
  EXPECT_GT(windowed, 15 * 24 / 2);  // most crops decoded less than the frame
}

// The window decode reads no pixel below the crop, but a file damaged there is still corrupt.
TEST(StreamingImageFolder, DamageBelowTheCropFailsNamingTheFile) {
  const ScratchDir dir;
  testing::run_oracle("data_streaming.py", "jpegs " + dir.path().string());
  for (const char* name : {"420-500x375.jpg", "444-333x251.jpg", "progressive-500x375.jpg"}) {
    const auto path = dir.path() / name;
    const auto top_left = [](int64_t, int64_t) { return DecodeRequest{0, 0, 40, 30, 20, 20}; };
    EXPECT_NO_THROW(decode_for_region(path, top_left));
    std::filesystem::resize_file(path, std::filesystem::file_size(path) * 3 / 4);
    try {
      decode_for_region(path, top_left);
      ADD_FAILURE() << name << ": a truncated JPEG must fail even when its crop lies above the damage";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path.string() + ": corrupt JPEG"), std::string::npos) << e.what();
    }
  }
}

TEST(StreamingImageFolder, LoaderBatchesAreTheSameOnAnyNumberOfThreads) {
  const ScratchDir dir;
  testing::run_oracle("data_streaming.py", "make " + dir.path().string());
  std::vector<std::vector<torch::Tensor>> runs;
  for (const int threads : {1, 3}) {
    const auto ds = streamed((dir.path() / "train").string(), threads);
    LoaderOptions options;
    options.batch_size = 5;
    options.seed = 4;
    options.augment.random_crop = options.augment.horizontal_flip = true;
    Loader loader(ds, options);
    runs.emplace_back();
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      loader.start_epoch(epoch);
      while (auto batch = loader.next()) {
        EXPECT_EQ(batch->images.sizes(), (std::vector<int64_t>{batch->labels.size(0), 3, kSize, kSize}));
        runs.back().push_back(batch->images);
        runs.back().push_back(batch->labels.to(torch::kFloat));
      }
    }
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  ASSERT_EQ(runs[0].size(), 2u * 2 * 3);  // two epochs of 12 images in batches of 5 (the last short)
  for (size_t i = 0; i < runs[0].size(); ++i) EXPECT_TRUE(torch::equal(runs[0][i], runs[1][i])) << i;
  // The second epoch's crops are new ones.
  EXPECT_FALSE(torch::equal(runs[0][0], runs[0][6]));
}

TEST(StreamingImageFolder, CorruptFileFailsItsBatchNamingTheFile) {
  const ScratchDir dir;
  testing::run_oracle("data_streaming.py", "make " + dir.path().string());
  const auto bad = dir.path() / "train" / "c1" / "03.jpg";
  const auto size = std::filesystem::file_size(bad);
  std::filesystem::resize_file(bad, size / 2);
  const auto ds = streamed((dir.path() / "train").string());
  LoaderOptions options;
  options.batch_size = 4;
  options.shuffle = false;
  Loader loader(ds, options);
  loader.start_epoch(0);
  try {
    while (loader.next()) {
    }
    FAIL() << "a truncated JPEG must fail its batch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad.string() + ": corrupt JPEG"), std::string::npos) << e.what();
  }
}

TEST(StreamingImageFolder, SubsetsKeepTheirFilesAndAutoStreamsMixedSizes) {
  const ScratchDir dir;
  testing::run_oracle("data_streaming.py", "make " + dir.path().string());
  const auto ds = streamed((dir.path() / "test").string());
  const auto half = spread_subset(ds, 6);
  ASSERT_EQ(half.size(), 6);
  EXPECT_TRUE(torch::equal(decode(half, 1, false, 0), decode(ds, 2, false, 0)));
  EXPECT_EQ(half.labels[5].item<int64_t>(), ds.labels[10].item<int64_t>());
  EXPECT_EQ(choose_image_loading((dir.path() / "train").string()), "stream");
  DataSpec spec{"imagefolder", dir.path().string()};
  spec.image_size = kSize;
  EXPECT_EQ(resolve_image_loading(spec).image_loading, "stream");
  EXPECT_TRUE(open_dataset(spec, /*train=*/false, 2).is_streamed());
}

}  // namespace
}  // namespace ptrain::data
