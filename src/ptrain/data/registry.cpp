#include "ptrain/data/registry.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "ptrain/core/error.h"
#include "ptrain/data/cifar_binary.h"
#include "ptrain/data/idx.h"
#include "ptrain/data/image_folder.h"
#include "ptrain/data/streaming_image_folder.h"
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

// root/train and root/test, decoded whole or streamed as the spec says.
Dataset open_folder(const DataSpec& spec, const fs::path& root, bool train, int threads) {
  const std::string split = (root / (train ? "train" : "test")).string();
  const std::string mode =
      spec.image_loading == "auto" ? choose_image_loading((root / "train").string()) : spec.image_loading;
  if (mode == "stream") {
    check(spec.image_size > 0,
          spec.image_loading == "auto"
              ? root.string() + " is streamed (its training images take more than 1 GiB on disk or differ in size), "
                                "which crops every image to --image-size: give --image-size"
              : "--image-loading stream needs --image-size, the side the images of " + root.string() + " are cropped to");
    StreamingOptions options;
    options.image_size = spec.image_size;
    options.threads = threads;
    return open_streaming_image_folder(split, options);
  }
  check(mode == "memory", "--image-loading: unknown mode '" + mode + "' (known: auto, memory, stream)");
  return load_image_folder(split, threads);
}

Dataset open_cifar10(const DataSpec& spec, bool train, int threads) {
  const std::string path = require_path(spec);
  const fs::path dir(path);
  const bool binary = has_cifar_binary(dir) || has_cifar_binary(dir / "cifar-10-batches-bin");
  check(!binary || spec.image_loading != "stream",
        "--image-loading stream: " + path + " holds CIFAR-10's binary release, not an image folder");
  if (has_cifar_binary(dir)) return load_cifar10_binary(dir.string(), train);
  if (has_cifar_binary(dir / "cifar-10-batches-bin")) return load_cifar10_binary((dir / "cifar-10-batches-bin").string(), train);
  if (fs::is_directory(dir / "train") && fs::is_directory(dir / "test")) return open_folder(spec, dir, train, threads);
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
  check(spec.image_loading == "auto" || spec.name == "cifar10" || spec.name == "imagefolder",
        "--image-loading " + spec.image_loading + " applies to image folders (--dataset imagefolder or cifar10), not to " +
            spec.name);
  if (spec.name == "cifar10") return open_cifar10(spec, train, threads);
  if (spec.name == "imagefolder") return open_folder(spec, fs::path(require_path(spec)), train, threads);
  if (spec.name == "synthetic") return open_synthetic(spec.path, train);
  if (spec.name == "synthetic-tokens") return open_synthetic_tokens(spec.path, spec.seq_len, train);
  if (spec.name == "text") return load_text_tokens(spec.path, spec.seq_len, train);
  std::string known;
  for (const auto& name : dataset_names()) known += (known.empty() ? "" : ", ") + name;
  throw Error("unknown dataset '" + spec.name + "'; known: " + known);
}

DataSpec resolve_image_loading(DataSpec spec) {
  if (spec.image_loading != "auto" || spec.path.empty()) return spec;
  const fs::path root(spec.path);
  const bool folder = spec.name == "imagefolder" ||
                      (spec.name == "cifar10" && !has_cifar_binary(root) && !has_cifar_binary(root / "cifar-10-batches-bin"));
  if (folder && fs::is_directory(root / "train")) spec.image_loading = choose_image_loading((root / "train").string());
  return spec;
}

bool is_token_dataset(const std::string& name) { return name == "synthetic-tokens" || name == "text"; }

Normalization default_normalization(const std::string& name) {
  if (name == "cifar10") return {{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}};
  if (name == "fashion-mnist") return {{0.2860f}, {0.3530f}};
  if (name == "mnist") return {{0.1307f}, {0.3081f}};
  return {{0.5f}, {0.5f}};
}

namespace {

std::vector<float> normalization_values(const std::string& text, const std::string& whole) {
  const auto syntax = [&](const std::string& what) {
    return Error("--normalize '" + whole + "': " + what + "; expected MEAN,STD (one value for every channel, e.g. "
                 "0.5,0.5), MEANS/STDS per channel (e.g. 0.485,0.456,0.406/0.229,0.224,0.225) or none");
  };
  std::vector<float> values;
  for (const auto& field : split(text, ',')) {
    size_t used = 0;
    double value = 0;
    try {
      value = std::stod(field, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (field.empty() || used != field.size() || !std::isfinite(value)) throw syntax("'" + field + "' is not a number");
    // The values are floats: 1e39 would be an infinity, and pixels divided by it all zero.
    check(std::isfinite(static_cast<float>(value)),
          "--normalize '" + whole + "': '" + field + "' is beyond a float's range (at most 3.4e38)");
    values.push_back(static_cast<float>(value));
  }
  return values;
}

}  // namespace

Normalization parse_normalization(const std::string& text) {
  if (text == "none") return {{0.0f}, {1.0f}};
  const auto slash = text.find('/');
  Normalization result;
  if (slash == std::string::npos) {
    const auto values = normalization_values(text, text);
    check(values.size() == 2, "--normalize '" + text + "': expected MEAN,STD (two values, e.g. 0.5,0.5), got " +
                                  std::to_string(values.size()) +
                                  "; per channel, write the means, a slash and the standard deviations "
                                  "(e.g. 0.485,0.456,0.406/0.229,0.224,0.225)");
    result = {{values[0]}, {values[1]}};
  } else {
    result.mean = normalization_values(text.substr(0, slash), text);
    result.std = normalization_values(text.substr(slash + 1), text);
    check(result.mean.size() == result.std.size(),
          "--normalize '" + text + "': " + std::to_string(result.mean.size()) + " means but " +
              std::to_string(result.std.size()) + " standard deviations; give one of each a channel");
  }
  for (const float s : result.std) {
    check(s > 0, "--normalize '" + text + "': a standard deviation must be greater than 0");
    // Pixels in [0, 1] divided by more come out 1e-30 or less apart: inputs no model learns from, without a word.
    check(s <= 1e30f, "--normalize '" + text + "': a standard deviation must be at most 1e30 (pixels "
                                     "are in [0, 1]: divided by more, every input is within 1e-30 of zero)");
  }
  return result;
}

std::string describe_normalization(const Normalization& normalization) {
  const auto list = [](const std::vector<float>& values) {
    std::string text;
    for (const float v : values) {
      char number[32];
      std::snprintf(number, sizeof(number), "%.4g", static_cast<double>(v));
      text += (text.empty() ? "" : ",") + std::string(number);
    }
    return text;
  };
  return "mean " + list(normalization.mean) + " std " + list(normalization.std);
}

}  // namespace ptrain::data
