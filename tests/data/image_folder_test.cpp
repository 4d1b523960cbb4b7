// Image folders against torchvision's ImageFolder on files written by PIL, and their failure modes.
#include <gtest/gtest.h>


#include "ptrain/data/image_folder.h"
#include "ptrain/data/registry.h"
#include "test_util.h"

namespace ptrain::data {
namespace {

using testing::expect_error_mentioning;
using testing::ScratchDir;

struct OracleFolder {
  torch::Tensor images;
  std::vector<int64_t> labels;
  std::vector<std::string> classes;
  std::vector<std::string> paths;
};

OracleFolder torchvision_image_folder(const std::string& root, const std::string& out) {
  testing::run_oracle("data_image_folder.py", "dump " + root + " " + out);
  OracleFolder folder;
  std::ifstream shape_file(out + "/shape.txt");
  std::vector<int64_t> shape(4);
  for (auto& d : shape) shape_file >> d;
  auto bytes = testing::read_bytes(out + "/images.u8");
  folder.images = torch::from_blob(bytes.data(), shape, torch::kUInt8).clone();
  std::ifstream labels_file(out + "/labels.txt");
  for (int64_t label; labels_file >> label;) folder.labels.push_back(label);
  std::ifstream classes_file(out + "/classes.txt");
  for (std::string name; std::getline(classes_file, name);) folder.classes.push_back(name);
  std::ifstream paths_file(out + "/paths.txt");
  for (std::string path; std::getline(paths_file, path);) folder.paths.push_back(path);
  return folder;
}

bool is_png(const std::string& path) {
  auto ext = std::filesystem::path(path).extension().string();
  for (auto& ch : ext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return ext == ".png";
}

TEST(ImageFolder, MatchesTorchvisionImageFolder) {
  ScratchDir dir;
  testing::run_oracle("data_image_folder.py", "make " + (dir / "root"));
  const auto expected = torchvision_image_folder(dir / "root", dir / "oracle");
  for (int threads : {1, 2, 3}) {
    const auto ds = load_image_folder(dir / "root", threads);
    EXPECT_EQ(ds.classes, expected.classes);
    EXPECT_EQ(ds.classes, (std::vector<std::string>{"ant", "mole", "zebra"}));
    ASSERT_EQ(ds.images.sizes(), expected.images.sizes());
    EXPECT_EQ(std::vector<int64_t>(ds.labels.data_ptr<int64_t>(), ds.labels.data_ptr<int64_t>() + ds.size()),
              expected.labels);
    // PNG is lossless: exact. JPEG: PIL and we both use Debian's libjpeg-turbo with default settings, so the
    // decode should agree to the last bit; up to 2 levels are allowed for a different IDCT build.
    ASSERT_EQ(static_cast<int64_t>(expected.paths.size()), ds.size());
    int jpegs = 0, exact_jpegs = 0;
    for (int64_t i = 0; i < ds.size(); ++i) {
      const auto diff = (ds.images[i].to(torch::kInt) - expected.images[i].to(torch::kInt)).abs().max().item<int>();
      if (!is_png(expected.paths[i])) {
        ++jpegs;
        exact_jpegs += diff == 0;
        EXPECT_LE(diff, 2) << expected.paths[i];
      } else {
        EXPECT_EQ(diff, 0) << expected.paths[i];
      }
    }
    EXPECT_EQ(jpegs, 3);
    if (threads == 1) std::cout << exact_jpegs << " of " << jpegs << " JPEGs decode bit-identical to PIL\n";
  }
}

TEST(ImageFolder, RegistryOpensTrainAndTestSplits) {
  ScratchDir dir;
  testing::run_oracle("data_image_folder.py", "make " + (dir / "set/train"));
  testing::run_oracle("data_image_folder.py", "make-mixed " + (dir / "set/test"));
  EXPECT_EQ(open_dataset({"imagefolder", dir / "set"}, true, 2).size(), 10);
  EXPECT_EQ(open_dataset({"cifar10", dir / "set"}, true, 2).size(), 10);
  // The mixed test split fails, which also shows the test folder is the one read.
  expect_error_mentioning([&] { open_dataset({"cifar10", dir / "set"}, false, 2); }, {dir / "set/test/b/2.png"});
}

TEST(ImageFolder, MixedSizesNameTheFileAndBothSizes) {
  ScratchDir dir;
  testing::run_oracle("data_image_folder.py", "make-mixed " + (dir / "root"));
  expect_error_mentioning([&] { load_image_folder(dir / "root", 2); },
                          {dir / "root/b/2.png", "7x6", "7x5", dir / "root/a/1.png"});
}

TEST(ImageFolder, MissingOrEmptyFoldersAreNamed) {
  ScratchDir dir;
  expect_error_mentioning([&] { load_image_folder(dir / "nowhere", 1); }, {dir / "nowhere", "not found"});
  std::filesystem::create_directories(dir / "no_classes");
  expect_error_mentioning([&] { load_image_folder(dir / "no_classes", 1); }, {dir / "no_classes", "no class"});
  std::filesystem::create_directories(dir / "no_images/cat");
  std::ofstream(dir / "no_images/cat/readme.txt") << "text";
  expect_error_mentioning([&] { load_image_folder(dir / "no_images", 1); }, {dir / "no_images", "no .jpg"});
}

// Overwrites one file of the folder the oracle generated.
void replace_file(const ScratchDir& dir, const std::string& relative, const std::vector<uint8_t>& bytes) {
  testing::write_bytes(dir / ("root/" + relative), bytes);
}

TEST(ImageFolder, CorruptJpegAndPngNameTheFile) {
  ScratchDir dir;
  testing::run_oracle("data_image_folder.py", "make " + (dir / "root"));
  const auto jpeg = testing::read_bytes(dir / "root/ant/photo.jpg");
  const auto png = testing::read_bytes(dir / "root/zebra/b.png");

  auto truncated_jpeg = jpeg;
  truncated_jpeg.resize(jpeg.size() * 2 / 3);
  replace_file(dir, "ant/photo.jpg", truncated_jpeg);
  expect_error_mentioning([&] { load_image_folder(dir / "root", 2); }, {dir / "root/ant/photo.jpg", "JPEG"});

  replace_file(dir, "ant/photo.jpg", std::vector<uint8_t>(300, 0x5a));
  expect_error_mentioning([&] { load_image_folder(dir / "root", 2); }, {dir / "root/ant/photo.jpg", "JPEG"});

  // Garbage in the entropy-coded data after a valid header.
  auto garbled_jpeg = jpeg;
  for (size_t i = jpeg.size() / 2; i < jpeg.size() - 2; ++i) garbled_jpeg[i] = 0xff;
  replace_file(dir, "ant/photo.jpg", garbled_jpeg);
  expect_error_mentioning([&] { load_image_folder(dir / "root", 1); }, {dir / "root/ant/photo.jpg"});
  replace_file(dir, "ant/photo.jpg", jpeg);

  auto truncated_png = png;
  truncated_png.resize(png.size() - 20);
  replace_file(dir, "zebra/b.png", truncated_png);
  expect_error_mentioning([&] { load_image_folder(dir / "root", 2); }, {dir / "root/zebra/b.png", "PNG"});

  auto bad_crc_png = png;
  bad_crc_png[40] ^= 0xff;  // inside the first chunks: a CRC or IDAT error
  replace_file(dir, "zebra/b.png", bad_crc_png);
  expect_error_mentioning([&] { load_image_folder(dir / "root", 2); }, {dir / "root/zebra/b.png", "PNG"});

  replace_file(dir, "zebra/b.png", std::vector<uint8_t>{'n', 'o', 't'});
  expect_error_mentioning([&] { load_image_folder(dir / "root", 2); }, {dir / "root/zebra/b.png", "PNG"});
}

// ImageFolder refuses a class without images: here it would add a class no sample has.
TEST(ImageFolder, AnEmptyClassFolderAmongOthersIsNamed) {
  ScratchDir dir;
  testing::run_oracle("data_image_folder.py", "make " + (dir / "root"));
  std::filesystem::create_directories(dir / "root/koala");
  expect_error_mentioning([&] { load_image_folder(dir / "root", 1); }, {dir / "root/koala", "no .jpg"});
}

TEST(ImageFolder, TrainAndTestClassListsMustMatch) {
  EXPECT_NO_THROW(check_same_classes("/d/train", {"ant", "mole", "zebra"}, "/d/test", {"ant", "mole", "zebra"}));
  // A test split without "mole" would score zebras as moles.
  expect_error_mentioning([&] { check_same_classes("/d/train", {"ant", "mole", "zebra"}, "/d/test", {"ant", "zebra"}); },
                          {"/d/train (3)", "/d/test (2)", "/d/test lacks 'mole'"});
  expect_error_mentioning([&] { check_same_classes("/d/train", {"ant"}, "/d/test", {"ant", "bee", "cat"}); },
                          {"/d/train lacks 'bee', 'cat'"});
}

}  // namespace
}  // namespace ptrain::data
