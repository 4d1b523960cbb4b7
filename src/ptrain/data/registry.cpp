#include "ptrain/data/registry.h"

#include <filesystem>
#include <sstream>

#include "ptrain/core/error.h"
#include "ptrain/data/cifar_binary.h"
#include "ptrain/data/idx.h"
#include "ptrain/data/image_folder.h"
#include "ptrain/data/synthetic.h"
#include "ptrain/data/tokens.h"

namespace ptrain::data {

namespace {

namespace fs = std::filesystem;

constexpr const char* kFashionMnistDefault = "/usr/share/datasets/fashion-mnist";

std::string require_path(const DataSpec& spec) {
  check(!spec.path.empty(), "dataset " + spec.name + ": a path is required");
  return spec.path;
}

bool has_cifar_binary(const fs::path& dir) {
  return fs::exists(dir / "data_batch_1.bin") || fs::exists(dir / "test_batch.bin");
}

Dataset open_cifar10(const std::string& path, bool train, int threads) {
  const fs::path dir(path);
  if (has_cifar_binary(dir)) return load_cifar10_binary(dir.string(), train);
  if (has_cifar_binary(dir / "cifar-10-batches-bin")) return load_cifar10_binary((dir / "cifar-10-batches-bin").string(), train);
  if (fs::is_directory(dir / "train") && fs::is_directory(dir / "test"))
    return load_image_folder((dir / (train ? "train" : "test")).string(), threads);
  throw Error(path + ": no CIFAR-10 found: expected data_batch_1.bin or test_batch.bin (directly or in "
                     "cifar-10-batches-bin/), or train/ and test/ image folders");
}

int64_t parse_positive(const std::string& text, const std::string& spec) {
  const auto value = positive_field(text);
  check(value.has_value(),
        "synthetic dataset spec '" + spec + "': '" + text + "' is not a positive integer (format N:CxHxW:classes)");
  return *value;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  std::string part;
  while (std::getline(stream, part, separator)) parts.push_back(part);
  if (!text.empty() && text.back() == separator) parts.push_back("");
  return parts;
}

Dataset open_synthetic(const std::string& path, bool train) {
  const std::string spec = path.empty() ? "50000:3x32x32:10" : path;
  const auto fields = split(spec, ':');
  check(fields.size() == 3, "synthetic dataset spec '" + spec + "': expected N:CxHxW:classes, e.g. 50000:3x32x32:10");
  const auto dims = split(fields[1], 'x');
  check(dims.size() == 3, "synthetic dataset spec '" + spec + "': expected CxHxW in the middle, e.g. 3x32x32");
  const int64_t n = parse_positive(fields[0], spec);
  const int64_t classes = parse_positive(fields[2], spec);
  const int64_t images = train ? n : std::max<int64_t>(n / 5, 1);
  return make_synthetic(images, parse_positive(dims[0], spec), parse_positive(dims[1], spec),
                        parse_positive(dims[2], spec), classes, train ? 1 : 2);
}

}  // namespace

std::vector<std::string> dataset_names() {
  return {"fashion-mnist", "mnist", "cifar10", "imagefolder", "synthetic", "synthetic-tokens", "text"};
}

Dataset open_dataset(const DataSpec& spec, bool train, int threads) {
  if (spec.name == "fashion-mnist") return load_fashion_mnist(spec.path.empty() ? kFashionMnistDefault : spec.path, train);
  if (spec.name == "mnist") return load_mnist(require_path(spec), train);
  if (spec.name == "cifar10") return open_cifar10(require_path(spec), train, threads);
  if (spec.name == "imagefolder")
    return load_image_folder((fs::path(require_path(spec)) / (train ? "train" : "test")).string(), threads);
  if (spec.name == "synthetic") return open_synthetic(spec.path, train);
  if (spec.name == "synthetic-tokens") return open_synthetic_tokens(spec.path, spec.seq_len, train);
  if (spec.name == "text") return load_text_tokens(spec.path, spec.seq_len, train);
  std::string known;
  for (const auto& name : dataset_names()) known += (known.empty() ? "" : ", ") + name;
  throw Error("unknown dataset '" + spec.name + "'; known: " + known);
}

Normalization default_normalization(const std::string& name) {
  if (name == "cifar10") return {{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}};
  if (name == "fashion-mnist") return {{0.2860f}, {0.3530f}};
  if (name == "mnist") return {{0.1307f}, {0.3081f}};
  return {{0.5f}, {0.5f}};
}

}  // namespace ptrain::data
