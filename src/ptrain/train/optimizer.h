// SGD and AdamW with torch.optim's update rules, written on multi-tensor (foreach) kernels.
//
// Why not torch::optim: a step skipped by the loss scaler must be decided on the device, from the
// scaler's found_inf tensor, with no host read (so the step can be captured in a CUDA graph); and the
// sharded strategies need optimizers over flat shards that they own. Both need the state in our hands.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "ptrain/io/named_tensors.h"

namespace ptrain::train {

enum class OptimizerKind { sgd, adamw };

// "sgd" or "adamw", as --optimizer names it.
std::string optimizer_name(OptimizerKind kind);

// The optimizer's flags as train/plan.h's optimizer_options resolves them (--optimizer parsed into its kind): what
// make_optimizer builds from, so that the run (train/run/) needs no config to build it.
struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::sgd;
  double lr = 0.1;
  double momentum = 0.9;      // sgd
  bool nesterov = false;      // sgd
  double weight_decay = 5e-4;  // sgd: L2 added to the gradient; adamw: decoupled
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adamw
  // The state tensors a parameter has: adamw two moments, sgd with momentum one, plain sgd none.
  int64_t slots() const { return kind == OptimizerKind::adamw ? 2 : (momentum > 0 ? 1 : 0); }
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // One update of every parameter from its .grad(), at learning rate lr. With found_inf (a 0/1 float
  // scalar tensor on the parameters' device), a 1 leaves parameters and state exactly as they were.
  void step(double lr, const torch::Tensor* found_inf) {
    set_learning_rate(lr);
    step_at_set_rate(found_inf);
  }

  // The same in two parts, for CUDA graphs: set_learning_rate runs eagerly before each replay (fused
  // optimizers keep the rate in a device tensor that the captured step reads), step_at_set_rate is captured.
  virtual void set_learning_rate(double lr) = 0;
  virtual void step_at_set_rate(const torch::Tensor* found_inf) = 0;
  // Whether the step reads nothing from the host but the device tensors above: only then can it be captured.
  virtual bool capturable() const = 0;
  // "fused" (one multi-tensor kernel, at::_fused_sgd_/_fused_adamw_) or "foreach" (LibTorch's foreach ops).
  virtual std::string implementation() const = 0;

  // Optimizer state keyed "<param name>.<slot>", for checkpoints.
  virtual io::NamedTensors state() const = 0;
  virtual void load_state(const io::NamedTensors& state, const std::string& source) = 0;

  const std::vector<torch::Tensor>& params() const { return params_; }
  void zero_grad();  // drops gradients (set_to_none), as torch.optim does by default

 protected:
  Optimizer(std::vector<torch::Tensor> params, std::vector<std::string> names);
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
};

// Elements one batch of the update covers (2^26: 256 MiB in fp32); larger tensors are updated in slices.
// Bounds the update's temporaries (a few batches) whatever the size of the parameters or shards.
constexpr int64_t kOptimizerBatchElements = int64_t{1} << 26;

// params are the tensors the optimizer updates (model parameters, or fp32 master copies); names label
// them in the state. Weight decay applies to every parameter, as torchvision's reference recipes do.
// allow_fused: use the fused kernels where LibTorch has them for these parameters (CUDA, 2.4+); the
// foreach path is the reference they are tested against (tests/kernels).
std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options, std::vector<torch::Tensor> params,
                                          std::vector<std::string> names,
                                          int64_t batch_elements = kOptimizerBatchElements, bool allow_fused = false);

}  // namespace ptrain::train
