#include "ptrain/models/zoo.h"

#include "ptrain/core/error.h"
#include "ptrain/models/gpt.h"
#include "ptrain/models/resnet.h"
#include "ptrain/models/torchscript_model.h"

namespace ptrain::models {

namespace {

// Stems that shrink 32x32 images to 8x8 before the first block waste most of the network on them.
constexpr int64_t kLargestCifarStemImage = 64;

const std::vector<int> kTorchvisionDepths = {18, 34, 50, 101, 152};
const std::vector<int> kCifarDepths = {20, 32, 44, 56};

// GPT-2's sizes (124M, 350M, 774M, 1.5B parameters at its 50257-token vocabulary), and a tiny one for
// tests and the CPU. --gpt-layers/--gpt-width/--gpt-heads reshape any of them.
struct GptSize {
  const char* name;
  int64_t layers, width, heads;
};
const std::vector<GptSize> kGptSizes = {
    {"gpt-tiny", 2, 64, 4}, {"gpt-small", 12, 768, 12}, {"gpt-medium", 24, 1024, 16},
    {"gpt-large", 36, 1280, 20}, {"gpt-xl", 48, 1600, 25}};

GptOptions gpt_options(const ModelSpec& spec, const GptSize& size) {
  check(spec.num_classes > 0, "model '" + spec.name + "': the vocabulary size must be positive, got " +
                                  std::to_string(spec.num_classes));
  check(spec.seq_len > 0, "model '" + spec.name + "': seq_len must be positive, got " + std::to_string(spec.seq_len));
  GptOptions options;
  options.name = spec.name;
  options.vocab_size = spec.num_classes;
  options.seq_len = spec.seq_len;
  options.layers = spec.layers > 0 ? spec.layers : size.layers;
  options.width = spec.width > 0 ? spec.width : size.width;
  options.heads = spec.heads > 0 ? spec.heads : size.heads;
  return options;
}

std::string join(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& n : names) text += (text.empty() ? "" : ", ") + n;
  return text;
}

}  // namespace

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (int d : kTorchvisionDepths) {
    const std::string base = "resnet" + std::to_string(d);
    names.insert(names.end(), {base, base + "-cifar", base + "-imagenet"});
  }
  for (int d : kCifarDepths) names.push_back("resnet" + std::to_string(d));
  for (const auto& size : kGptSizes) names.push_back(size.name);
  return names;
}

bool is_language_model(const std::string& name) { return name.rfind("gpt-", 0) == 0; }

std::optional<int64_t> parameters_without_building(const ModelSpec& spec) {
  for (const auto& size : kGptSizes) {
    if (spec.name == size.name) return gpt_parameter_count(gpt_options(spec, size));
  }
  return std::nullopt;
}

std::shared_ptr<Model> make_model(const ModelSpec& spec) {
  if (is_torchscript_path(spec.name)) {
    ScriptInput input;
    input.tokens = spec.image_size == 0 && spec.seq_len > 0;
    input.sample_shape = input.tokens ? std::vector<int64_t>{spec.seq_len}
                                      : std::vector<int64_t>{spec.in_channels, spec.image_size, spec.image_size};
    input.classes = spec.num_classes;
    input.data_description = spec.data.empty() ? "the data" : spec.data;
    return TorchScriptModel::load(spec.name, input);
  }
  for (const auto& size : kGptSizes) {
    if (spec.name == size.name) return std::make_shared<Gpt>(gpt_options(spec, size));
  }
  check(spec.num_classes > 0, "model '" + spec.name + "': num_classes must be positive, got " +
                                  std::to_string(spec.num_classes));
  check(spec.in_channels > 0, "model '" + spec.name + "': in_channels must be positive, got " +
                                  std::to_string(spec.in_channels));
  check(spec.image_size > 0, "model '" + spec.name + "': image_size must be positive, got " +
                                 std::to_string(spec.image_size));
  ResNetOptions options;
  options.num_classes = spec.num_classes;
  options.in_channels = spec.in_channels;
  for (int d : kCifarDepths) {
    if (spec.name == "resnet" + std::to_string(d)) {
      options.depth = d;
      return std::make_shared<ResNet>(options);
    }
  }
  for (int d : kTorchvisionDepths) {
    const std::string base = "resnet" + std::to_string(d);
    options.depth = d;
    if (spec.name == base) {
      options.cifar_stem = spec.image_size <= kLargestCifarStemImage;
      return std::make_shared<ResNet>(options);
    }
    if (spec.name == base + "-cifar" || spec.name == base + "-imagenet") {
      options.cifar_stem = spec.name == base + "-cifar";
      return std::make_shared<ResNet>(options);
    }
  }
  throw Error("unknown model '" + spec.name + "'; known models: " + join(model_names()));
}

}  // namespace ptrain::models
