#include "ptrain/data/cifar_binary.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "ptrain/core/error.h"

namespace ptrain::data {

namespace {

constexpr int64_t kSide = 32;
constexpr int64_t kImageBytes = 3 * kSide * kSide;
constexpr int64_t kRecordBytes = 1 + kImageBytes;
constexpr int64_t kClasses = 10;

std::vector<std::string> class_names(const std::filesystem::path& dir) {
  std::ifstream meta(dir / "batches.meta.txt");
  if (!meta) {
    return {"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"};
  }
  std::vector<std::string> names;
  std::string line;
  while (std::getline(meta, line)) {
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;  // the release pads the file with blank lines
    const auto last = line.find_last_not_of(" \t\r");
    names.push_back(line.substr(first, last - first + 1));
  }
  check(static_cast<int64_t>(names.size()) == kClasses,
        (dir / "batches.meta.txt").string() + ": expected 10 class names, found " + std::to_string(names.size()));
  return names;
}

}  // namespace

Dataset load_cifar10_binary(const std::string& dir_name, bool train) {
  namespace fs = std::filesystem;
  const fs::path dir(dir_name);
  std::vector<fs::path> files;
  if (train) {
    for (int i = 1; i <= 5; ++i) files.push_back(dir / ("data_batch_" + std::to_string(i) + ".bin"));
  } else {
    files.push_back(dir / "test_batch.bin");
  }

  std::vector<int64_t> records_per_file;
  int64_t total = 0;
  for (const auto& file : files) {
    std::error_code ec;
    const auto bytes = fs::file_size(file, ec);
    check(!ec, file.string() + ": cannot read CIFAR-10 batch file (" + ec.message() + ")");
    check(bytes % kRecordBytes == 0, file.string() + ": size " + std::to_string(bytes) +
                                         " bytes is not a multiple of the 3073-byte CIFAR-10 record");
    // An empty file would train no step or evaluate to 0/0 (a test accuracy of "-nan%").
    check(bytes > 0, file.string() + ": holds no CIFAR-10 records (0 bytes): an empty split");
    records_per_file.push_back(static_cast<int64_t>(bytes) / kRecordBytes);
    total += records_per_file.back();
  }

  auto images = torch::empty({total, 3, kSide, kSide}, torch::kUInt8);
  auto labels = torch::empty({total}, torch::kInt64);
  uint8_t* image_out = images.data_ptr<uint8_t>();
  int64_t* label_out = labels.data_ptr<int64_t>();
  std::vector<char> record(kRecordBytes);
  int64_t n = 0;
  for (size_t f = 0; f < files.size(); ++f) {
    std::ifstream in(files[f], std::ios::binary);
    check(static_cast<bool>(in), files[f].string() + ": cannot open CIFAR-10 batch file");
    for (int64_t r = 0; r < records_per_file[f]; ++r, ++n) {
      in.read(record.data(), kRecordBytes);
      check(in.gcount() == kRecordBytes, files[f].string() + ": short read at record " + std::to_string(r));
      const auto label = static_cast<uint8_t>(record[0]);
      check(label < kClasses, files[f].string() + ": record " + std::to_string(r) + " has label " +
                                  std::to_string(label) + ", CIFAR-10 labels are 0..9");
      label_out[n] = label;
      // The record is already planar R, G, B: the N x C x H x W layout.
      std::memcpy(image_out + n * kImageBytes, record.data() + 1, kImageBytes);
    }
  }

  Dataset ds;
  ds.images = images;
  ds.labels = labels;
  ds.classes = class_names(dir);
  ds.description = std::string("CIFAR-10 binary ") + (train ? "train" : "test") + " split from " + dir_name + " (" +
                   std::to_string(total) + " images 3x32x32)";
  return ds;
}

}  // namespace ptrain::data
