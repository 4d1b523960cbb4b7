// Batch normalisation whose batch statistics are those of the global batch over all ranks, as
// torch.nn.SyncBatchNorm computes them: forward all-reduces per-channel sums, backward all-reduces the
// matching gradient sums, so N ranks on B/N samples each train like one process on B samples.
//
// ptrain's own norm layer (models::BatchNorm2d, which the zoo's models use) hands its normalisation
// over in place. A torch::nn::BatchNorm2d can only be swapped in the module registry, which a model
// that calls its children through typed member handles never sees; SyncBatchNorm2dImpl therefore
// counts its calls so the DDP strategy can refuse, with a clear error, a model whose forward bypassed
// the swap instead of silently training unsynchronised.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "ptrain/distributed/process_group.h"

namespace ptrain::strategies {

// Normalises x (N, C, H, W) with the global batch mean and biased variance over all ranks of group and
// updates running_mean / running_var (unbiased, global count) as BatchNorm does. weight and bias may be
// undefined (affine=false); running_mean / running_var may be undefined (track_running_stats=false).
torch::Tensor sync_batch_norm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                              const torch::Tensor& running_mean, const torch::Tensor& running_var, double momentum,
                              double eps, distributed::ProcessGroup& group);

// Takes the place of a torch::nn::BatchNorm2d, holding the very same parameter and buffer tensors under
// the same names, so optimizers, checkpoints and state dicts do not notice the swap.
class SyncBatchNorm2dImpl : public torch::nn::Module {
 public:
  SyncBatchNorm2dImpl(const torch::nn::BatchNorm2dImpl& original, std::shared_ptr<distributed::ProcessGroup> group);
  torch::Tensor forward(const torch::Tensor& x);
  int64_t calls() const { return calls_; }

  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  torch::nn::BatchNormOptions options_;
  std::shared_ptr<distributed::ProcessGroup> group_;
  int64_t calls_ = 0;
};

struct ConvertedNorm {
  std::string name;  // dotted path from the root, e.g. "features.bn"
  std::shared_ptr<SyncBatchNorm2dImpl> module;
};

// Makes every models::BatchNorm2d under root (recursively) normalise over the group, and replaces every
// registered torch::nn::BatchNorm2d by a SyncBatchNorm2dImpl (returned, so their use can be checked).
std::vector<ConvertedNorm> convert_sync_batchnorm(torch::nn::Module& root, std::shared_ptr<distributed::ProcessGroup> group);

}  // namespace ptrain::strategies
