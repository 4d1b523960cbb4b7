// Batch augmentation against torchvision.transforms.functional applied sample by sample on the same draws.
#include <gtest/gtest.h>

#include <sstream>

#include "ptrain/data/augment.h"
#include "test_util.h"

namespace ptrain::data {
namespace {

using testing::ScratchDir;

torch::Tensor random_batch(int64_t b, int64_t c, int64_t h, int64_t w, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randint(0, 256, {b, c, h, w}, torch::kUInt8);
}

std::string join(const std::vector<float>& values) {
  std::ostringstream out;
  out.precision(9);
  for (size_t i = 0; i < values.size(); ++i) out << (i ? ":" : "") << values[i];
  return out.str();
}

// Runs the oracle on images and draw (nullptr: eval) and returns its float32 result.
torch::Tensor oracle_augment(const ScratchDir& dir, const torch::Tensor& images, const AugmentOptions& options,
                             const AugmentDraw* draw, const std::vector<int64_t>& out_shape) {
  const auto contiguous = images.contiguous();
  testing::write_bytes(dir / "in.u8", std::vector<uint8_t>(contiguous.data_ptr<uint8_t>(),
                                                           contiguous.data_ptr<uint8_t>() + contiguous.numel()));
  std::ofstream draws(dir / "draws.txt");
  if (draw != nullptr) {
    for (int64_t i = 0; i < images.size(0); ++i)
      draws << draw->crop_dy[i].item<int64_t>() << " " << draw->crop_dx[i].item<int64_t>() << " "
            << draw->flip[i].item<bool>() << "\n";
  }
  draws.close();
  std::ostringstream opts;
  opts << "crop=" << options.random_crop << ",padding=" << options.crop_padding << ",flip=" << options.horizontal_flip
       << ",resize=" << options.resize << ",eval=" << (draw == nullptr) << ",mean=" << join(options.mean)
       << ",std=" << join(options.std);
  std::ostringstream args;
  args << dir / "in.u8";
  for (auto d : images.sizes()) args << " " << d;
  args << " " << dir / "draws.txt" << " " << opts.str() << " " << dir / "out.f32";
  testing::run_oracle("data_augment.py", args.str());
  auto bytes = testing::read_bytes(dir / "out.f32");
  auto result = torch::empty(out_shape, torch::kFloat);
  EXPECT_EQ(bytes.size(), static_cast<size_t>(result.numel()) * sizeof(float));
  std::memcpy(result.data_ptr<float>(), bytes.data(), std::min(bytes.size(), result.numel() * sizeof(float)));
  return result;
}

void expect_close(const torch::Tensor& actual, const torch::Tensor& expected) {
  ASSERT_EQ(actual.sizes(), expected.sizes());
  EXPECT_LE((actual.to(torch::kFloat) - expected).abs().max().item<float>(), 1e-5f);
}

TEST(Augment, DrawsAreInRangeDeterministicAndVaried) {
  AugmentOptions options;
  options.crop_padding = 3;
  const auto a = draw_augmentation(4000, options, 11);
  const auto b = draw_augmentation(4000, options, 11);
  const auto c = draw_augmentation(4000, options, 12);
  EXPECT_TRUE(torch::equal(a.crop_dy, b.crop_dy) && torch::equal(a.crop_dx, b.crop_dx) && torch::equal(a.flip, b.flip));
  EXPECT_FALSE(torch::equal(a.crop_dy, c.crop_dy));
  EXPECT_EQ(a.crop_dy.scalar_type(), torch::kInt64);
  EXPECT_EQ(a.flip.scalar_type(), torch::kBool);
  EXPECT_TRUE(a.crop_dy.device().is_cpu());
  // Every offset 0..6 occurs and nothing else; flips are about half.
  EXPECT_TRUE(torch::equal(torch::bincount(a.crop_dx).gt(400), torch::ones({7}, torch::kBool)));
  EXPECT_EQ(a.crop_dy.min().item<int64_t>(), 0);
  EXPECT_EQ(a.crop_dy.max().item<int64_t>(), 6);
  EXPECT_NEAR(a.flip.to(torch::kFloat).mean().item<float>(), 0.5, 0.05);
}

TEST(Augment, CropFlipNormalizeMatchTorchvision) {
  ScratchDir dir;
  const auto images = random_batch(16, 3, 8, 9, 1);
  AugmentOptions options;
  options.random_crop = true;
  options.crop_padding = 4;
  options.horizontal_flip = true;
  options.mean = {0.4914f, 0.4822f, 0.4465f};
  options.std = {0.2470f, 0.2435f, 0.2616f};
  const auto draw = draw_augmentation(16, options, 3);
  // Both extremes of the offsets and both flip states appear, or the comparison proves little.
  ASSERT_TRUE(draw.flip.any().item<bool>() && (~draw.flip).any().item<bool>());
  const auto result = augment_batch(images, options, &draw);
  EXPECT_EQ(result.scalar_type(), torch::kFloat);
  expect_close(result, oracle_augment(dir, images, options, &draw, {16, 3, 8, 9}));
}

TEST(Augment, CropOnlyAndFlipOnlyMatchTorchvision) {
  ScratchDir dir;
  const auto images = random_batch(8, 1, 5, 5, 2);
  AugmentOptions crop_only;
  crop_only.random_crop = true;
  crop_only.crop_padding = 2;
  const auto draw = draw_augmentation(8, crop_only, 4);
  expect_close(augment_batch(images, crop_only, &draw), oracle_augment(dir, images, crop_only, &draw, {8, 1, 5, 5}));
  AugmentOptions flip_only;
  flip_only.horizontal_flip = true;
  flip_only.mean = {0.2860f};
  flip_only.std = {0.3530f};
  expect_close(augment_batch(images, flip_only, &draw), oracle_augment(dir, images, flip_only, &draw, {8, 1, 5, 5}));
}

TEST(Augment, ResizeUpAndDownMatchesTorchvisionBilinear) {
  ScratchDir dir;
  // Non-square: the shorter side (6) becomes `resize`, the longer one int(resize * 8 / 6).
  const auto images = random_batch(5, 3, 6, 8, 5);
  AugmentOptions up;
  up.random_crop = true;
  up.horizontal_flip = true;
  up.resize = 15;
  up.mean = {0.5f};
  up.std = {0.25f};
  const auto draw = draw_augmentation(5, up, 9);
  expect_close(augment_batch(images, up, &draw), oracle_augment(dir, images, up, &draw, {5, 3, 15, 20}));
  // Channels-last: normalised and laid out before the resize, which keeps the layout; the same values.
  AugmentOptions up_channels_last = up;
  up_channels_last.channels_last = true;
  up_channels_last.mean = {0.1f, 0.2f, 0.3f};
  up_channels_last.std = {0.5f, 0.6f, 0.7f};
  const auto laid_out = augment_batch(images, up_channels_last, &draw);
  EXPECT_TRUE(laid_out.is_contiguous(torch::MemoryFormat::ChannelsLast));
  expect_close(laid_out, oracle_augment(dir, images, up_channels_last, &draw, {5, 3, 15, 20}));
  AugmentOptions down;
  down.resize = 4;
  expect_close(augment_batch(images, down, &draw), oracle_augment(dir, images, down, &draw, {5, 3, 4, 5}));
}

TEST(Augment, EvalAppliesNoCropOrFlip) {
  ScratchDir dir;
  const auto images = random_batch(4, 3, 6, 6, 6);
  AugmentOptions options;
  options.random_crop = true;
  options.horizontal_flip = true;
  options.mean = {0.1f, 0.2f, 0.3f};
  options.std = {0.5f, 0.6f, 0.7f};
  expect_close(augment_batch(images, options, nullptr), oracle_augment(dir, images, options, nullptr, {4, 3, 6, 6}));
}

TEST(Augment, OutputDtypeAndChannelsLast) {
  const auto images = random_batch(4, 3, 6, 6, 7);
  AugmentOptions options;
  options.horizontal_flip = true;
  options.mean = {0.5f};
  options.std = {0.5f};
  const auto draw = draw_augmentation(4, options, 1);
  const auto reference = augment_batch(images, options, &draw);
  options.out_dtype = torch::kBFloat16;
  options.channels_last = true;
  const auto result = augment_batch(images, options, &draw);
  EXPECT_EQ(result.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(result.is_contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_FALSE(result.is_contiguous());
  EXPECT_TRUE(torch::equal(result, reference.to(torch::kBFloat16)));
  // Pixel 0 normalised by 0.5/0.5 is -1, pixel 255 is +1.
  EXPECT_LE(reference.min().item<float>(), -0.99f);
  EXPECT_GE(reference.max().item<float>(), 0.99f);
  EXPECT_GE(reference.min().item<float>(), -1.0f);
}

TEST(Augment, BadInputsAreRejected) {
  AugmentOptions options;
  options.mean = {0.1f, 0.2f};
  options.std = {0.1f, 0.2f};
  testing::expect_error_mentioning([&] { augment_batch(random_batch(2, 3, 4, 4, 1), options, nullptr); },
                                   {"mean", "2 values", "3 channels"});
  testing::expect_error_mentioning([&] { augment_batch(torch::zeros({2, 3, 4, 4}), AugmentOptions{}, nullptr); },
                                   {"uint8"});
  AugmentOptions crop;
  crop.random_crop = true;
  const auto draw = draw_augmentation(3, crop, 1);
  testing::expect_error_mentioning([&] { augment_batch(random_batch(2, 3, 4, 4, 1), crop, &draw); },
                                   {"3 samples", "2"});
}

}  // namespace
}  // namespace ptrain::data
