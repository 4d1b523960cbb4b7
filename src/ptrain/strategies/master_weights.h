// fp32 master copies of half-precision parameters: the optimizer updates the copies, so small updates
// are not rounded away in fp16/bf16, then the model's half weights are refreshed from them.
#pragma once

#include <vector>

#include <torch/torch.h>

namespace ptrain::strategies {

class MasterWeights {
 public:
  explicit MasterWeights(std::vector<torch::Tensor> model_params);

  // The fp32 copies, in model parameter order; their .grad() is filled by copy_grads_to_masters().
  const std::vector<torch::Tensor>& masters() const { return masters_; }

  // Upcasts each model gradient into its master's gradient (and drops the half gradient).
  void copy_grads_to_masters();
  // Rounds the updated masters into the model's parameters.
  void copy_masters_to_params();

 private:
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> masters_;
};

}  // namespace ptrain::strategies
