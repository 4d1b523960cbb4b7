// Data parallelism in one process, with PyTorch's DataParallel semantics but not its per-step cost:
// DataParallel re-replicates the module on every forward; here the replicas are made once, in
// prepare(), and kept. Each step the batch is split over the devices, the replicas' forwards run in
// parallel threads, and the outputs are gathered on the first device, where the loss is taken.
// Backward flows back through the gather into every replica at once (the autograd engine runs one
// thread per CUDA device); finish_backward() sums the replicas' gradients into the model on the first
// device with one NCCL reduce per dtype. Parameters live in one flat buffer per dtype on every
// device, so the optimizer's update reaches the replicas as one NCCL broadcast before the next forward.
//
// Each replica after the first runs on a thread of its own for the whole run (cuDNN caches its plans
// per thread; see data_parallel.cpp). Replica 0 is the model itself; its buffers (BatchNorm running
// statistics) are the ones that count, and are copied to the other replicas before every forward, as
// DataParallel does. Each replica normalises with the statistics of its own part of the batch (no
// synchronised BatchNorm, as in PyTorch, where SyncBatchNorm refuses DataParallel).
//
// On the CPU the same code runs replicas that are all on the CPU (tests); the reduce and broadcast are
// then tensor copies.
#pragma once

#include <memory>
#include <vector>

#include "ptrain/strategies/strategy.h"

namespace ptrain::strategies {

class DataParallel final : public Strategy {
 public:
  // devices[0] is where the model, the inputs and the loss are. All CUDA devices or all CPU.
  explicit DataParallel(std::vector<torch::Device> devices);
  ~DataParallel() override;

  std::string name() const override { return "dp"; }
  int64_t rank() const override { return 0; }
  int64_t world_size() const override { return 1; }
  int64_t replicas() const override { return static_cast<int64_t>(devices_.size()); }

  // Makes the replicas (Model::make_replica), moves every parameter and buffer into its device's flat
  // buffers and copies the model's values into the replicas.
  void prepare(models::Model& model) override;
  // Splits inputs along dim 0 over the replicas (as torch.chunk does: the last part may be smaller, and
  // a batch smaller than the replica count leaves replicas idle) and returns the gathered outputs on
  // devices[0].
  torch::Tensor forward(models::Model& model, const torch::Tensor& inputs) override;
  // Nothing is communicated during backward: the reduce in finish_backward() happens once per
  // optimizer step whatever the accumulation, so there is nothing to switch off.
  void set_gradient_sync(bool) override {}
  // Sums every replica's gradients into the model's .grad (the loss was taken over the whole batch on
  // devices[0], so each replica's gradient is its share and the sum is the full gradient), then zeroes
  // the other replicas' gradients. The next forward broadcasts the stepped parameters.
  void finish_backward() override;
  torch::Tensor all_reduce_sum(torch::Tensor t) override { return t; }

  const std::vector<torch::Device>& devices() const { return devices_; }

  struct State;

 private:
  std::vector<torch::Device> devices_;
  std::unique_ptr<State> state_;
};

}  // namespace ptrain::strategies
