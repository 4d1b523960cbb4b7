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

// Calls fn(node, name) once for every autograd function in loss's graph, name being its qualified name
// (LibTorch 2.x may wrap it in CppNode<...>; the closing '>' is dropped, so that names end alike).
template <typename Fn>
void for_each_autograd_function(const torch::Tensor& loss, Fn&& fn) {
  std::vector<torch::autograd::Node*> todo{loss.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!todo.empty()) {
    auto* node = todo.back();
    todo.pop_back();
    if (!node || !seen.insert(node).second) continue;
    auto name = node->name();
    if (!name.empty() && name.back() == '>') name.pop_back();
    fn(*node, name);
    for (const auto& edge : node->next_edges()) todo.push_back(edge.function.get());
  }
}

inline bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Which of names end the names of the autograd functions in loss's graph: whether a fused path ran (a fallback to
// LibTorch's ops would pass every numerical comparison).
inline std::set<std::string> autograd_functions(const torch::Tensor& loss, const std::vector<std::string>& names) {
  std::set<std::string> found;
  for_each_autograd_function(loss, [&](const torch::autograd::Node&, const std::string& name) {
    for (const auto& f : names)
      if (ends_with(name, f)) found.insert(f);
  });
  return found;
}

// How many autograd functions in loss's graph whose names end with name have `outputs` forward outputs (the
// gradients their backward takes): a function that returned a twin of its output has two.
inline size_t autograd_functions_with_outputs(const torch::Tensor& loss, const std::string& name, size_t outputs) {
  size_t count = 0;
  for_each_autograd_function(loss, [&](const torch::autograd::Node& node, const std::string& n) {
    if (ends_with(n, name) && node.num_inputs() == outputs) ++count;
  });
  return count;
}
