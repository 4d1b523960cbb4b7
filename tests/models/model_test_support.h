// Small helpers of the models tests.
#pragma once

#include <torch/torch.h>

#include <stdexcept>
#include <string>

#include "ptrain/io/named_tensors.h"

namespace ptrain::testing {

inline const torch::Tensor& tensor_named(const io::NamedTensors& tensors, const std::string& name) {
  for (const auto& [key, tensor] : tensors) {
    if (key == name) return tensor;
  }
  throw std::runtime_error("no tensor named " + name);
}

// norm(actual - reference) / norm(reference), in double.
inline double relative_error(const torch::Tensor& actual, const torch::Tensor& reference) {
  const auto a = actual.to(torch::kDouble);
  const auto r = reference.to(torch::kDouble);
  return (a - r).norm().item<double>() / r.norm().item<double>();
}

}  // namespace ptrain::testing
