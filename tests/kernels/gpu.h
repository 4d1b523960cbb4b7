// Skips a test without a CUDA device: the fused kernels exist only there.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <string>
#include <vector>

#include "ptrain/kernels/cross_entropy.h"

#define PTRAIN_REQUIRE_CUDA_KERNELS()                                                                           \
  do {                                                                                                         \
    if (!torch::cuda::is_available() || !ptrain::kernels::fused_kernels_available(torch::Device(torch::kCUDA, 0))) \
      GTEST_SKIP() << "needs a CUDA device and a CUDA build (runs on the GPU machine: scripts/gpu_session.sh test)"; \
  } while (0)

inline double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  const auto g = got.to(torch::kCPU, torch::kDouble), w = want.to(torch::kCPU, torch::kDouble);
  return (g - w).norm().item<double>() / std::max(1e-30, w.norm().item<double>());
}

// Which of names end the names of the autograd functions in loss's graph: whether a fused path ran (a fallback to
// LibTorch's ops would pass every numerical comparison).
inline std::set<std::string> autograd_functions(const torch::Tensor& loss, const std::vector<std::string>& names) {
  std::set<std::string> found;
  std::vector<torch::autograd::Node*> todo{loss.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!todo.empty()) {
    auto* node = todo.back();
    todo.pop_back();
    if (!node || !seen.insert(node).second) continue;
    auto name = node->name();  // the function's qualified name (LibTorch 2.x may wrap it in CppNode<...>)
    if (!name.empty() && name.back() == '>') name.pop_back();
    for (const auto& f : names)
      if (name.size() >= f.size() && name.compare(name.size() - f.size(), f.size(), f) == 0) found.insert(f);
    for (const auto& edge : node->next_edges()) todo.push_back(edge.function.get());
  }
  return found;
}

// How many autograd functions in loss's graph whose names end with name have `outputs` forward outputs (the
// gradients their backward takes): a function that returned a twin of its output has two.
inline size_t autograd_functions_with_outputs(const torch::Tensor& loss, const std::string& name, size_t outputs) {
  size_t count = 0;
  std::vector<torch::autograd::Node*> todo{loss.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!todo.empty()) {
    auto* node = todo.back();
    todo.pop_back();
    if (!node || !seen.insert(node).second) continue;
    auto n = node->name();
    if (!n.empty() && n.back() == '>') n.pop_back();
    if (n.size() >= name.size() && n.compare(n.size() - name.size(), name.size(), name) == 0 &&
        node->num_inputs() == outputs)
      ++count;
    for (const auto& edge : node->next_edges()) todo.push_back(edge.function.get());
  }
  return count;
}
