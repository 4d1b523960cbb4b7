// Image folders against torchvision's ImageFolder on files written by PIL, and their failure modes.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <zlib.h>

// jpeglib.h needs size_t and FILE declared before it.
#include <cstdio>
#include <jpeglib.h>

#include "ptrain/data/image_folder.h"
#include "ptrain/data/jpeg_decode.h"
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

// An 8x8 JPEG whose SOF0 header claims width x height: a few hundred bytes that say they decode to gigabytes.
std::vector<uint8_t> jpeg_claiming(int width, int height) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = 8;
  cinfo.image_height = 8;
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  std::vector<uint8_t> row(8 * 3, 128);
  while (cinfo.next_scanline < 8) {
    JSAMPROW rows[1] = {row.data()};
    jpeg_write_scanlines(&cinfo, rows, 1);
  }
  jpeg_finish_compress(&cinfo);
  std::vector<uint8_t> bytes(buffer, buffer + size);
  std::free(buffer);
  jpeg_destroy_compress(&cinfo);
  for (size_t i = 2; i + 9 < bytes.size(); ++i) {
    if (bytes[i] == 0xff && bytes[i + 1] == 0xc0) {  // SOF0: length, precision, then height and width, big-endian
      bytes[i + 5] = static_cast<uint8_t>(height >> 8);
      bytes[i + 6] = static_cast<uint8_t>(height & 0xff);
      bytes[i + 7] = static_cast<uint8_t>(width >> 8);
      bytes[i + 8] = static_cast<uint8_t>(width & 0xff);
      return bytes;
    }
  }
  ADD_FAILURE() << "no SOF0 marker in the encoded JPEG";
  return bytes;
}

// A PNG of signature, an IHDR of width x height RGB (its CRC right), an IDAT of no real data and IEND.
std::vector<uint8_t> png_claiming(uint32_t width, uint32_t height) {
  std::vector<uint8_t> bytes{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  const auto chunk = [&](const char* type, const std::vector<uint8_t>& data) {
    const auto be32 = [&](uint32_t v) {
      for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<uint8_t>(v >> shift));
    };
    be32(static_cast<uint32_t>(data.size()));
    const size_t start = bytes.size();
    bytes.insert(bytes.end(), type, type + 4);
    bytes.insert(bytes.end(), data.begin(), data.end());
    be32(static_cast<uint32_t>(crc32(0, bytes.data() + start, static_cast<uInt>(bytes.size() - start))));
  };
  std::vector<uint8_t> header;
  for (const uint32_t v : {width, height})
    for (int shift = 24; shift >= 0; shift -= 8) header.push_back(static_cast<uint8_t>(v >> shift));
  header.insert(header.end(), {8, 2, 0, 0, 0});  // 8 bits, RGB, deflate, no filter, not interlaced
  chunk("IHDR", header);
  chunk("IDAT", {0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01});
  chunk("IEND", {});
  return bytes;
}

int64_t peak_rss_kib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

// A 3 kB JPEG whose header claims 30000 x 30000 pixels was refused only after 2.8 GB of RSS (65500 x 65500:
// std::bad_alloc, naming no file). Every loader refuses such a file from its header, naming it and the bound.
TEST(ImageFolder, ImagesWhoseHeaderClaimsTooManyPixelsAreRefusedBeforeTheirPixelsAreAllocated) {
  ScratchDir dir;
  const std::string jpeg = dir / "root/ant/bomb.jpg", png = dir / "root/zebra/bomb.png";
  testing::write_bytes(jpeg, jpeg_claiming(20000, 10000));  // 200 million pixels, 0.6 GB decoded
  testing::write_bytes(png, png_claiming(20000, 10000));
  const int64_t peak_before = peak_rss_kib();
  const std::vector<std::string> named{"its header says 20000x10000 pixels",
                                       "at most " + std::to_string(kMaxImagePixels) + " pixels"};
  for (const std::string& file : {jpeg, png}) {
    auto parts = named;
    parts.push_back(file);
    expect_error_mentioning([&] { decode_image_file(file); }, parts);
    expect_error_mentioning([&] { image_dimensions(file); }, parts);
    bool asked = false;
    expect_error_mentioning([&] {
      decode_for_region(file, [&](int64_t width, int64_t height) {
        asked = true;
        return DecodeRequest{0, 0, static_cast<double>(width), static_cast<double>(height), 224, 224};
      });
    }, parts);
    EXPECT_FALSE(asked) << file << ": the streamed decode chose a crop of an image it must refuse";
  }
  expect_error_mentioning([&] { load_image_folder(dir / "root", 1); }, {jpeg, "at most"});
  EXPECT_LT(peak_rss_kib() - peak_before, 100 * 1024) << "KiB of peak RSS grown while refusing";
  // Within the bound, a large image's header is read as before.
  testing::write_bytes(jpeg, jpeg_claiming(13000, 13000));
  EXPECT_EQ(image_dimensions(jpeg), (std::pair<int64_t, int64_t>{13000, 13000}));
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
