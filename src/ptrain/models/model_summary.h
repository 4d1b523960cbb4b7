// What a model holds, as a training run states it at its start and --dry-run lists it: parameters per
// top-level module, how many train, their dtypes, and the bytes of parameters and buffers.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ptrain::models {

struct ModelSummary {
  struct Part {
    std::string name;  // the first component of its tensors' state_dict names ("layer1", "fc")
    int64_t parameters = 0, trainable = 0;
  };
  std::vector<Part> parts;  // in the order the model registers its parameters
  int64_t parameters = 0, trainable = 0;
  int64_t parameter_bytes = 0;
  int64_t buffers = 0, buffer_bytes = 0;  // elements and bytes of the buffers (batch norm statistics, ...)
  std::vector<std::pair<std::string, int64_t>> dtypes;  // parameter elements per dtype ("float32"), in order met
};

// Counted from the state_dict names, so a TorchScript model (whose tensors the root registers by their
// full names) groups as its eager module's top-level children do.
ModelSummary summarize_model(const torch::nn::Module& model);

// "11,689,512 parameters (11,689,512 trainable, float32, 44.6 MiB), buffers 9,620 elements (38.4 KiB)" and
// then one line a top-level module, indented, with its share.
std::string describe_model_summary(const ModelSummary& summary);

// 1234567 -> "1,234,567".
std::string with_commas(int64_t n);
// Bytes as B, KiB, MiB or GiB, one decimal.
std::string byte_text(int64_t bytes);

}  // namespace ptrain::models
