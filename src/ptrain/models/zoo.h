// Models by name, as configs and the command line ask for them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ptrain/models/model.h"

namespace ptrain::models {

struct ModelSpec {
  std::string name;
  int64_t num_classes;
  int64_t in_channels;
  int64_t image_size;  // side of the (square) input images
};

// resnet18/34/50/101/152 take the CIFAR stem (3x3 conv, no max-pool) for images up to 64 pixels and
// torchvision's ImageNet stem above; the suffixes -cifar and -imagenet force one. resnet20/32/44/56 are
// He et al.'s CIFAR ResNets. An unknown name throws ptrain::Error listing model_names().
std::shared_ptr<Model> make_model(const ModelSpec& spec);

std::vector<std::string> model_names();

}  // namespace ptrain::models
