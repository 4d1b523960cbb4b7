// Tensors by name, in the order a state_dict lists them: file formats keep that order so that a
// checkpoint read back lists its entries as the model that wrote it did.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

namespace ptrain::io {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

}  // namespace ptrain::io
