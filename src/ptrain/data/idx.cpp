#include "ptrain/data/idx.h"

#include <zlib.h>

#include <cstring>
#include <filesystem>

#include "ptrain/core/error.h"

namespace ptrain::data {

namespace {

constexpr uint32_t kImagesMagic = 2051;  // unsigned byte data, 3 dimensions
constexpr uint32_t kLabelsMagic = 2049;  // unsigned byte data, 1 dimension

// gzread passes files that are not gzipped through unchanged, so one reader serves both forms.
std::vector<uint8_t> read_maybe_gzipped(const std::string& path) {
  check(std::filesystem::is_regular_file(path), path + ": IDX file not found");
  gzFile file = gzopen(path.c_str(), "rb");
  check(file != nullptr, path + ": cannot open IDX file");
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> chunk(1 << 20);
  for (;;) {
    const int got = gzread(file, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (got < 0) {
      int code = 0;
      const std::string why = gzerror(file, &code);
      gzclose(file);
      throw Error(path + ": corrupt gzip data (" + why + ")");
    }
    if (got == 0) break;
    bytes.insert(bytes.end(), chunk.begin(), chunk.begin() + got);
  }
  // A gzip stream cut short reads as a clean end of file; gzclose is where zlib reports it.
  const int closed = gzclose(file);
  check(closed == Z_OK, path + ": truncated or corrupt gzip data (zlib code " + std::to_string(closed) + ")");
  return bytes;
}

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Checks magic and size and returns the dims; the payload follows the header.
std::vector<int64_t> parse_header(const std::vector<uint8_t>& bytes, const std::string& path, uint32_t magic,
                                  size_t dims) {
  const size_t header = 4 * (1 + dims);
  check(bytes.size() >= header, path + ": truncated IDX header (" + std::to_string(bytes.size()) + " bytes)");
  const uint32_t found = big_endian_u32(bytes.data());
  check(found == magic, path + ": bad IDX magic " + std::to_string(found) + ", expected " + std::to_string(magic));
  std::vector<int64_t> shape;
  int64_t payload = 1;
  for (size_t d = 0; d < dims; ++d) {
    shape.push_back(big_endian_u32(bytes.data() + 4 * (1 + d)));
    payload *= shape.back();
  }
  const auto expected = static_cast<int64_t>(header) + payload;
  const auto actual = static_cast<int64_t>(bytes.size());
  check(actual >= expected, path + ": truncated IDX data: " + std::to_string(actual) + " bytes, the header promises " +
                                std::to_string(expected));
  check(actual == expected, path + ": " + std::to_string(actual - expected) + " bytes after the IDX data");
  return shape;
}

std::string existing_variant(const std::filesystem::path& dir, const std::string& gz_name) {
  const auto gz = dir / gz_name;
  const auto plain = dir / gz_name.substr(0, gz_name.size() - 3);
  if (!std::filesystem::exists(gz) && std::filesystem::exists(plain)) return plain.string();
  return gz.string();  // when neither exists the error names the canonical file
}

Dataset load_named(const std::string& dir, bool train, std::vector<std::string> names, const std::string& title) {
  const std::string prefix = train ? "train" : "t10k";
  auto ds = load_idx_gz(existing_variant(dir, prefix + "-images-idx3-ubyte.gz"),
                        existing_variant(dir, prefix + "-labels-idx1-ubyte.gz"));
  const int64_t max_label = ds.size() > 0 ? ds.labels.max().item<int64_t>() : 0;
  check(max_label < static_cast<int64_t>(names.size()),
        dir + ": " + title + " label " + std::to_string(max_label) + " out of range 0..9");
  ds.classes = std::move(names);
  ds.description = title + " " + (train ? "train" : "test") + " split from " + dir + " (" +
                   std::to_string(ds.size()) + " images 1x" + std::to_string(ds.images.size(2)) + "x" +
                   std::to_string(ds.images.size(3)) + ")";
  return ds;
}

}  // namespace

Dataset load_idx_gz(const std::string& images_path, const std::string& labels_path) {
  const auto image_bytes = read_maybe_gzipped(images_path);
  const auto image_shape = parse_header(image_bytes, images_path, kImagesMagic, 3);
  const auto label_bytes = read_maybe_gzipped(labels_path);
  const auto label_shape = parse_header(label_bytes, labels_path, kLabelsMagic, 1);
  check(image_shape[0] == label_shape[0], images_path + " holds " + std::to_string(image_shape[0]) + " images but " +
                                              labels_path + " holds " + std::to_string(label_shape[0]) + " labels");

  const int64_t n = image_shape[0];
  // An empty split would train no step or evaluate to 0/0 (a test accuracy of "-nan%").
  check(n > 0, images_path + ": holds no images (the IDX header says 0): an empty split");
  auto images = torch::empty({n, 1, image_shape[1], image_shape[2]}, torch::kUInt8);
  std::memcpy(images.data_ptr<uint8_t>(), image_bytes.data() + 16, static_cast<size_t>(images.numel()));
  auto labels = torch::empty({n}, torch::kInt64);
  int64_t* label_out = labels.data_ptr<int64_t>();
  int64_t max_label = 0;
  for (int64_t i = 0; i < n; ++i) {
    label_out[i] = label_bytes[8 + i];
    max_label = std::max(max_label, label_out[i]);
  }

  Dataset ds;
  ds.images = images;
  ds.labels = labels;
  for (int64_t c = 0; c <= max_label; ++c) ds.classes.push_back(std::to_string(c));
  ds.description = "IDX " + images_path + " (" + std::to_string(n) + " images)";
  return ds;
}

Dataset load_fashion_mnist(const std::string& dir, bool train) {
  return load_named(dir, train,
                    {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                     "Ankle boot"},
                    "Fashion-MNIST");
}

Dataset load_mnist(const std::string& dir, bool train) {
  return load_named(dir, train, {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}, "MNIST");
}

}  // namespace ptrain::data
