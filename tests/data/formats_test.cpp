// CIFAR-10 binary, IDX, synthetic data and the registry, on small files written here.
#include <gtest/gtest.h>
#include <zlib.h>

#include "ptrain/data/cifar_binary.h"
#include "ptrain/data/idx.h"
#include "ptrain/data/registry.h"
#include "ptrain/data/synthetic.h"
#include "test_util.h"

namespace ptrain::data {
namespace {

using testing::expect_error_mentioning;
using testing::ScratchDir;
using testing::write_bytes;

// Pixel (c, y, x) of the image of global record r; distinct enough to catch a swapped axis or file order.
uint8_t cifar_pixel(int64_t r, int64_t c, int64_t y, int64_t x) {
  return static_cast<uint8_t>((r * 31 + c * 101 + y * 7 + x * 3) % 256);
}

// Writes a CIFAR-10 batch of `records` records starting at global record `first`; label of record r is r % 10.
void write_cifar_batch(const std::string& path, int64_t first, int64_t records) {
  std::vector<uint8_t> bytes;
  for (int64_t r = first; r < first + records; ++r) {
    bytes.push_back(static_cast<uint8_t>(r % 10));
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t y = 0; y < 32; ++y)
        for (int64_t x = 0; x < 32; ++x) bytes.push_back(cifar_pixel(r, c, y, x));
  }
  write_bytes(path, bytes);
}

void write_cifar_release(const std::string& dir) {
  for (int i = 1; i <= 5; ++i) write_cifar_batch(dir + "/data_batch_" + std::to_string(i) + ".bin", (i - 1) * 3, 3);
  write_cifar_batch(dir + "/test_batch.bin", 100, 4);
}

TEST(CifarBinary, ReadsRecordsInFileOrderAsPlanarRgb) {
  ScratchDir dir;
  write_cifar_release(dir / "cifar");
  const auto train = load_cifar10_binary(dir / "cifar", true);
  ASSERT_EQ(train.images.sizes(), (std::vector<int64_t>{15, 3, 32, 32}));
  EXPECT_EQ(train.images.scalar_type(), torch::kUInt8);
  EXPECT_TRUE(train.images.is_contiguous());
  auto image = train.images.accessor<uint8_t, 4>();
  for (int64_t r = 0; r < 15; ++r) {
    EXPECT_EQ(train.labels[r].item<int64_t>(), r % 10);
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t y = 0; y < 32; y += 5)
        for (int64_t x = 0; x < 32; x += 3) ASSERT_EQ(image[r][c][y][x], cifar_pixel(r, c, y, x));
  }
  EXPECT_EQ(train.classes.front(), "airplane");
  EXPECT_EQ(train.classes.back(), "truck");

  const auto test = load_cifar10_binary(dir / "cifar", false);
  ASSERT_EQ(test.size(), 4);
  EXPECT_EQ(test.images[3][2][31][31].item<uint8_t>(), cifar_pixel(103, 2, 31, 31));
  EXPECT_EQ(test.labels[3].item<int64_t>(), 103 % 10);
}

TEST(CifarBinary, ClassNamesFromMetaFile) {
  ScratchDir dir;
  write_cifar_release(dir / "cifar");
  std::ofstream(dir / "cifar/batches.meta.txt") << "c0\nc1\nc2\nc3\nc4\nc5\nc6\nc7\nc8\nc9\n\n\n";
  const auto test = load_cifar10_binary(dir / "cifar", false);
  ASSERT_EQ(test.classes.size(), 10u);
  EXPECT_EQ(test.classes[0], "c0");
  EXPECT_EQ(test.classes[9], "c9");
}

TEST(CifarBinary, BadFilesAreNamed) {
  ScratchDir dir;
  write_cifar_release(dir / "cifar");
  std::filesystem::remove(dir / "cifar/data_batch_3.bin");
  expect_error_mentioning([&] { load_cifar10_binary(dir / "cifar", true); }, {dir / "cifar/data_batch_3.bin"});

  auto truncated = testing::read_bytes(dir / "cifar/test_batch.bin");
  truncated.resize(truncated.size() - 100);
  write_bytes(dir / "cifar/test_batch.bin", truncated);
  expect_error_mentioning([&] { load_cifar10_binary(dir / "cifar", false); },
                          {dir / "cifar/test_batch.bin", "3073"});

  write_cifar_batch(dir / "cifar/test_batch.bin", 0, 2);
  auto bad_label = testing::read_bytes(dir / "cifar/test_batch.bin");
  bad_label[3073] = 10;
  write_bytes(dir / "cifar/test_batch.bin", bad_label);
  expect_error_mentioning([&] { load_cifar10_binary(dir / "cifar", false); },
                          {dir / "cifar/test_batch.bin", "record 1", "label 10"});
}

// A 0-byte batch file used to give an empty split: a test accuracy of 0/0, printed as "-nan%".
TEST(CifarBinary, AnEmptyBatchFileIsRefusedNamingIt) {
  ScratchDir dir;
  write_cifar_release(dir / "cifar");
  write_bytes(dir / "cifar/test_batch.bin", {});
  expect_error_mentioning([&] { load_cifar10_binary(dir / "cifar", false); },
                          {dir / "cifar/test_batch.bin", "no CIFAR-10 records", "empty split"});
  write_bytes(dir / "cifar/data_batch_4.bin", {});
  expect_error_mentioning([&] { load_cifar10_binary(dir / "cifar", true); }, {dir / "cifar/data_batch_4.bin"});
}

std::vector<uint8_t> idx_header(uint32_t magic, const std::vector<uint32_t>& dims) {
  std::vector<uint8_t> bytes;
  auto put = [&](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<uint8_t>(v >> shift));
  };
  put(magic);
  for (auto d : dims) put(d);
  return bytes;
}

// n images of rows x cols with pixel (i, y, x) = i + 10 y + x, labels (3 i) % 10.
std::pair<std::vector<uint8_t>, std::vector<uint8_t>> idx_files(uint32_t n, uint32_t rows, uint32_t cols) {
  auto images = idx_header(2051, {n, rows, cols});
  auto labels = idx_header(2049, {n});
  for (uint32_t i = 0; i < n; ++i) {
    labels.push_back(static_cast<uint8_t>((3 * i) % 10));
    for (uint32_t y = 0; y < rows; ++y)
      for (uint32_t x = 0; x < cols; ++x) images.push_back(static_cast<uint8_t>(i + 10 * y + x));
  }
  return {images, labels};
}

void write_gzip(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(file), Z_OK);
}

void expect_idx_content(const Dataset& ds, int64_t n, int64_t rows, int64_t cols) {
  ASSERT_EQ(ds.images.sizes(), (std::vector<int64_t>{n, 1, rows, cols}));
  auto image = ds.images.accessor<uint8_t, 4>();
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(ds.labels[i].item<int64_t>(), (3 * i) % 10);
    for (int64_t y = 0; y < rows; ++y)
      for (int64_t x = 0; x < cols; ++x) ASSERT_EQ(image[i][0][y][x], (i + 10 * y + x) % 256);
  }
}

TEST(Idx, GzippedAndPlainFilesDecodeTheSame) {
  ScratchDir dir;
  const auto [images, labels] = idx_files(12, 4, 3);
  write_gzip(dir / "img.gz", images);
  write_gzip(dir / "lab.gz", labels);
  write_bytes(dir / "img", images);
  write_bytes(dir / "lab", labels);
  expect_idx_content(load_idx_gz(dir / "img.gz", dir / "lab.gz"), 12, 4, 3);
  expect_idx_content(load_idx_gz(dir / "img", dir / "lab"), 12, 4, 3);
}

TEST(Idx, FashionMnistFileNamesAndClasses) {
  ScratchDir dir;
  const auto [images, labels] = idx_files(7, 28, 28);
  write_gzip(dir / "fm/t10k-images-idx3-ubyte.gz", images);
  write_gzip(dir / "fm/t10k-labels-idx1-ubyte.gz", labels);
  const auto test = load_fashion_mnist(dir / "fm", false);
  expect_idx_content(test, 7, 28, 28);
  ASSERT_EQ(test.classes.size(), 10u);
  EXPECT_EQ(test.classes[0], "T-shirt/top");
  EXPECT_EQ(test.classes[9], "Ankle boot");
  expect_error_mentioning([&] { load_fashion_mnist(dir / "fm", true); }, {dir / "fm/train-images-idx3-ubyte.gz"});
}

TEST(Idx, BadFilesAreNamed) {
  ScratchDir dir;
  const auto [images, labels] = idx_files(5, 3, 3);
  write_bytes(dir / "lab", labels);
  expect_error_mentioning([&] { load_idx_gz(dir / "missing", dir / "lab"); }, {dir / "missing", "not found"});

  auto bad_magic = images;
  bad_magic[3] = 0x01;  // 2049: a label file where images are expected
  write_bytes(dir / "img", bad_magic);
  expect_error_mentioning([&] { load_idx_gz(dir / "img", dir / "lab"); }, {dir / "img", "magic 2049"});

  auto truncated = images;
  truncated.resize(truncated.size() - 4);
  write_gzip(dir / "img.gz", truncated);
  expect_error_mentioning([&] { load_idx_gz(dir / "img.gz", dir / "lab"); }, {dir / "img.gz", "truncated"});

  // A gzip stream cut short, not only an IDX payload cut short.
  write_gzip(dir / "full.gz", images);
  auto cut_gzip = testing::read_bytes(dir / "full.gz");
  cut_gzip.resize(cut_gzip.size() / 2);
  write_bytes(dir / "cut.gz", cut_gzip);
  expect_error_mentioning([&] { load_idx_gz(dir / "cut.gz", dir / "lab"); }, {dir / "cut.gz"});

  write_bytes(dir / "img", images);
  const auto [other_images, four_labels] = idx_files(4, 3, 3);
  write_bytes(dir / "lab4", four_labels);
  expect_error_mentioning([&] { load_idx_gz(dir / "img", dir / "lab4"); },
                          {dir / "img", dir / "lab4", "5 images", "4 labels"});
}

// A t10k IDX of 0 images used to give an empty test split: a test accuracy of 0/0, printed as "-nan%".
TEST(Idx, AnEmptySplitIsRefusedNamingTheFile) {
  ScratchDir dir;
  const auto [images, labels] = idx_files(0, 28, 28);
  write_gzip(dir / "fm/t10k-images-idx3-ubyte.gz", images);
  write_gzip(dir / "fm/t10k-labels-idx1-ubyte.gz", labels);
  expect_error_mentioning([&] { load_fashion_mnist(dir / "fm", false); },
                          {dir / "fm/t10k-images-idx3-ubyte.gz", "no images", "empty split"});
}

TEST(Idx, RealFashionMnistWhenInstalled) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(dir + "/train-images-idx3-ubyte.gz")) GTEST_SKIP() << dir << " not installed";
  const auto train = open_dataset({"fashion-mnist", ""}, true, 1);
  ASSERT_EQ(train.images.sizes(), (std::vector<int64_t>{60000, 1, 28, 28}));
  // Published facts: 6,000 training images a class; the first training image is an ankle boot.
  EXPECT_TRUE(torch::equal(torch::bincount(train.labels), torch::full({10}, 6000, torch::kInt64)));
  EXPECT_EQ(train.classes[train.labels[0].item<int64_t>()], "Ankle boot");
  // Pixel sum of the whole test split, read independently by Python's gzip.
  const auto test = open_dataset({"fashion-mnist", ""}, false, 1);
  ASSERT_EQ(test.size(), 10000);
  const std::string python_sum =
      testing::oracle_output("data_idx_sum.py", dir + "/t10k-images-idx3-ubyte.gz");
  EXPECT_EQ(std::to_string(test.images.sum().item<int64_t>()), python_sum.substr(0, python_sum.find('\n')));
}

TEST(Synthetic, DeterministicBalancedAndLearnableFromTheMean) {
  const auto a = make_synthetic(2000, 3, 8, 8, 10, 5);
  const auto b = make_synthetic(2000, 3, 8, 8, 10, 5);
  const auto c = make_synthetic(2000, 3, 8, 8, 10, 6);
  ASSERT_EQ(a.images.sizes(), (std::vector<int64_t>{2000, 3, 8, 8}));
  EXPECT_EQ(a.images.scalar_type(), torch::kUInt8);
  EXPECT_TRUE(torch::equal(a.images, b.images));
  EXPECT_TRUE(torch::equal(a.labels, b.labels));
  EXPECT_FALSE(torch::equal(a.images, c.images));
  EXPECT_TRUE(torch::equal(torch::bincount(a.labels), torch::full({10}, 200, torch::kInt64)));
  // Class means from the first half classify the second half by the nearest mean brightness.
  const auto brightness = a.images.to(torch::kFloat).mean({1, 2, 3});
  auto class_mean = torch::zeros({10});
  for (int64_t k = 0; k < 10; ++k) {
    class_mean[k] = brightness.slice(0, 0, 1000).masked_select(a.labels.slice(0, 0, 1000) == k).mean();
  }
  const auto held_out = brightness.slice(0, 1000).view({-1, 1});
  const auto predicted = (held_out - class_mean.view({1, -1})).abs().argmin(1);
  const double accuracy = (predicted == a.labels.slice(0, 1000)).to(torch::kFloat).mean().item<double>();
  EXPECT_GT(accuracy, 0.95);
  // A single pixel alone does not give the class away.
  const auto first_pixel = a.images.select(1, 0).select(1, 0).select(1, 0).to(torch::kFloat);
  const auto pixel_predicted = (first_pixel.slice(0, 1000).view({-1, 1}) - class_mean.view({1, -1})).abs().argmin(1);
  EXPECT_LT((pixel_predicted == a.labels.slice(0, 1000)).to(torch::kFloat).mean().item<double>(), 0.6);
}

TEST(Registry, SyntheticSpecAndErrors) {
  const auto train = open_dataset({"synthetic", "20:1x4x5:3"}, true, 1);
  EXPECT_EQ(train.images.sizes(), (std::vector<int64_t>{20, 1, 4, 5}));
  EXPECT_EQ(train.classes.size(), 3u);
  EXPECT_EQ(open_dataset({"synthetic", "20:1x4x5:3"}, false, 1).size(), 4);
  expect_error_mentioning([] { open_dataset({"synthetic", "20:1x4:3"}, true, 1); }, {"20:1x4:3", "CxHxW"});
  expect_error_mentioning([] { open_dataset({"synthetic", "20:1x4x0:3"}, true, 1); }, {"20:1x4x0:3", "'0'"});
  expect_error_mentioning([] { open_dataset({"imagenet", ""}, true, 1); },
                          {"imagenet", "fashion-mnist", "mnist", "cifar10", "imagefolder", "synthetic"});
  expect_error_mentioning([] { open_dataset({"mnist", ""}, true, 1); }, {"mnist", "path"});
}

TEST(Registry, Cifar10FindsBinaryDirectlyOrInsideTheReleaseFolder) {
  ScratchDir dir;
  write_cifar_release(dir / "direct");
  write_cifar_release(dir / "release/cifar-10-batches-bin");
  EXPECT_EQ(open_dataset({"cifar10", dir / "direct"}, true, 1).size(), 15);
  EXPECT_EQ(open_dataset({"cifar10", dir / "release"}, false, 1).size(), 4);
  std::filesystem::create_directories(dir / "empty");
  expect_error_mentioning([&] { open_dataset({"cifar10", dir / "empty"}, true, 1); },
                          {dir / "empty", "data_batch_1.bin", "train/"});
}

TEST(Registry, NormalizationHasOneValueOrOnePerChannel) {
  EXPECT_EQ(default_normalization("cifar10").mean.size(), 3u);
  EXPECT_EQ(default_normalization("cifar10").std.size(), 3u);
  EXPECT_EQ(default_normalization("fashion-mnist").mean.size(), 1u);
  EXPECT_EQ(default_normalization("imagefolder").mean, std::vector<float>{0.5f});
}

// A standard deviation of 1e39 was a float infinity: every input zero, the run trained on nothing and exited 0.
TEST(Registry, NormalizationBeyondAFloatOrTooWideToLeaveAnyInputIsRefused) {
  EXPECT_EQ(parse_normalization("0.5,1e30").std, std::vector<float>{1e30f});
  expect_error_mentioning([] { parse_normalization("0.5,1e39"); }, {"--normalize '0.5,1e39'", "'1e39'", "float"});
  expect_error_mentioning([] { parse_normalization("1e39,0.5"); }, {"--normalize '1e39,0.5'", "'1e39'"});
  expect_error_mentioning([] { parse_normalization("0.5,1e31"); }, {"--normalize '0.5,1e31'", "at most 1e30"});
  expect_error_mentioning([] { parse_normalization("0,0,0/1,1e35,1"); }, {"--normalize", "at most 1e30"});
  expect_error_mentioning([] { parse_normalization("0.5,inf"); }, {"--normalize", "'inf' is not a number"});
  expect_error_mentioning([] { parse_normalization("0.5,0"); }, {"--normalize", "greater than 0"});
}

}  // namespace
}  // namespace ptrain::data

// A limit keeps samples spread over the dataset: a class-ordered folder keeps every class, images and
// labels stay paired, and the PyTorch reference picks the same indices (floor(i * N / limit)).
TEST(SpreadSubset, KeepsEveryClassOfAClassOrderedDataset) {
  ptrain::data::Dataset d;
  d.labels = torch::arange(10, torch::kInt64).div(2, "floor");  // 0 0 1 1 2 2 3 3 4 4
  d.images = torch::arange(10, torch::kInt64).to(torch::kUInt8).view({10, 1, 1, 1});
  const auto five = ptrain::data::spread_subset(d, 5);
  EXPECT_TRUE(torch::equal(five.labels, torch::tensor({0, 1, 2, 3, 4}, torch::kInt64))) << five.labels;
  EXPECT_TRUE(torch::equal(five.images.flatten().to(torch::kInt64), torch::tensor({0, 2, 4, 6, 8}, torch::kInt64)));
  const auto three = ptrain::data::spread_subset(d, 3);
  EXPECT_TRUE(torch::equal(three.images.flatten().to(torch::kInt64), torch::tensor({0, 3, 6}, torch::kInt64)));
  EXPECT_EQ(ptrain::data::spread_subset(d, 0).size(), 10);
  EXPECT_EQ(ptrain::data::spread_subset(d, 10).size(), 10);
  EXPECT_EQ(ptrain::data::spread_subset(d, 25).size(), 10);
}
