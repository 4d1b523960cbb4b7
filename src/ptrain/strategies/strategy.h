// How devices share the work of one training step. The trainer calls these hooks and nothing else:
// outside strategies/factory.cpp no code asks which strategy runs.
//
// Order within one optimizer step:
//   set_gradient_sync(false) ... backward of micro-batches 1..k-1 ... set_gradient_sync(true),
//   backward of micro-batch k, finish_backward(), then the trainer unscales, clips and steps.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "ptrain/config/train_config.h"
#include "ptrain/dist/environment.h"
#include "ptrain/models/model.h"

namespace ptrain::strategies {

class Strategy {
 public:
  virtual ~Strategy() = default;

  virtual std::string name() const = 0;
  virtual int64_t rank() const = 0;
  virtual int64_t world_size() const = 0;
  bool is_main() const { return rank() == 0; }
  // Devices this one process trains on, each with its own part of the batch: DP drives several, every
  // other strategy one. --batch-size counts per device, so a process's loader batch is
  // batch_size x replicas().
  virtual int64_t replicas() const { return 1; }

  // Called once, after the model is on its device and in its parameter dtype.
  virtual void prepare(models::Model& model) = 0;

  // The batch this process runs forward on (DP, for one, splits it over replicas).
  virtual torch::Tensor forward(models::Model& model, const torch::Tensor& inputs) { return model.forward(inputs); }

  // Accumulation micro-steps call this with false, so no communication happens until the last one.
  virtual void set_gradient_sync(bool enabled) = 0;

  // After the last micro-batch's backward: every gradient the optimizer reads is complete and reduced.
  virtual void finish_backward() = 0;

  // Sums a tensor over all ranks (metrics: loss sums, correct counts). In place; returns it.
  virtual torch::Tensor all_reduce_sum(torch::Tensor t) = 0;
};

// The strategy config.run.strategy names, with its process group formed from the launch environment.
std::unique_ptr<Strategy> make_strategy(const config::TrainConfig& config, torch::Device device,
                                        const dist::LaunchEnvironment& launch);

}  // namespace ptrain::strategies
