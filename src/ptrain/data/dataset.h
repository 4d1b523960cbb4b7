// A whole dataset decoded into memory as uint8: CIFAR-10 is 150 MB and Fashion-MNIST 47 MB, small enough that
// decoding once beats decoding every epoch, and uint8 keeps host memory and host-to-device traffic 4x below
// float. Streaming decode for ImageNet-scale folders (which would not fit) is not done.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ptrain::data {

struct Dataset {
  torch::Tensor images;  // uint8, N x C x H x W, CPU, contiguous
  torch::Tensor labels;  // int64, N
  std::vector<std::string> classes;
  std::string description;

  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

}  // namespace ptrain::data
