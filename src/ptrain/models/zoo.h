// Models by name, as configs and the command line ask for them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ptrain/models/model.h"

namespace ptrain::models {

struct ModelSpec {
  std::string name;
  int64_t num_classes;  // image models: classes; language models: the vocabulary size
  int64_t in_channels;  // image models
  int64_t image_size;   // image models: side of the (square) input images
  int64_t seq_len = 0;  // language models: the longest sequence (learned positions)
  // GPT models: override the named size's shape; 0 keeps it.
  int64_t layers = 0, width = 0, heads = 0;
  std::string data = "";  // the data it trains on, for messages (a TorchScript model is checked against it)
};

// resnet18/34/50/101/152 take the CIFAR stem (3x3 conv, no max-pool) for images up to 64 pixels and
// torchvision's ImageNet stem above; the suffixes -cifar and -imagenet force one. resnet20/32/44/56 are
// He et al.'s CIFAR ResNets. gpt-tiny/small/medium/large/xl are GPT-2 style language models (models/gpt.h)
// taking int64 tokens. A name ending in .pt or .pth is a TorchScript archive (models/torchscript_model.h),
// loaded and checked against the spec's data: num_classes logits for in_channels x image_size x
// image_size images, or vocabulary-wide logits per position for seq_len tokens (image_size 0). An unknown
// name throws ptrain::Error listing model_names().
std::shared_ptr<Model> make_model(const ModelSpec& spec);

std::vector<std::string> model_names();

// Whether `name` is a language model (int64 tokens in, logits per position out) rather than an image model.
bool is_language_model(const std::string& name);

// The parameters of the model spec asks for, counted without building it, where the zoo knows how
// (the GPTs); nullopt otherwise.
std::optional<int64_t> parameters_without_building(const ModelSpec& spec);

}  // namespace ptrain::models
