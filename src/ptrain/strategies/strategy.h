// How devices share the work of one training step. The trainer calls these hooks and nothing else:
// outside strategies/ no code asks which strategy runs (what one can do, StrategySpec says).
//
// Order within one optimizer step:
//   set_gradient_sync(false) ... backward of micro-batches 1..k-1 ... set_gradient_sync(true),
//   backward of micro-batch k, finish_backward(), then on the strategy's UpdateTarget:
//   gradients_ready(), the trainer unscales (agree_found_inf), clips (global_norm), steps the optimizer
//   over params(), then parameters_updated().
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "ptrain/distributed/launch_environment.h"
#include "ptrain/io/named_tensors.h"
#include "ptrain/models/model.h"
#include "ptrain/precision/policy.h"
#include "ptrain/strategy_spec/strategy_spec.h"

namespace ptrain::strategies {

// Bytes one rank holds for the model's state between steps, in three parts (ZeRO's accounting):
// parameters (in their training dtype), gradients (the storage kept for them), optimizer state
// (its slots, plus fp32 master weights when they exist).
struct ModelStateBytes {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t optimizer = 0;
};

// What the optimizer updates on this rank and how its update reaches the model. Replicated strategies
// (single, dp, ddp) hand it the model's parameters, or fp32 master copies of them; sharded ones hand it
// this rank's flat shards. The trainer's step does not know which.
class UpdateTarget {
 public:
  virtual ~UpdateTarget() = default;

  // The tensors the optimizer updates (it reads their .grad()), and their names, which key its state.
  virtual const std::vector<torch::Tensor>& params() const = 0;
  virtual const std::vector<std::string>& names() const = 0;

  // After Strategy::finish_backward(): params()' gradients hold the step's reduced gradients.
  virtual void gradients_ready() = 0;
  // A loss scaler's found_inf (0/1, computed from this rank's gradients) becomes 1 on every rank when
  // it is 1 on any, so that all ranks skip or take the step together. In place.
  virtual void agree_found_inf(const torch::Tensor& found_inf) = 0;
  // The L2 norm of all gradients of the model from the norm of params()' gradients on this rank.
  virtual torch::Tensor global_norm(const torch::Tensor& local_norm) = 0;
  // After the optimizer step: the model's parameters take the updated values.
  virtual void parameters_updated() = 0;

  // Checkpoints, collective (every rank calls; the result is complete on rank 0 at least). The model's
  // parameters by their model names, full size, fp32 masters where there are any: what a one-process
  // run saves.
  virtual io::NamedTensors full_parameters() = 0;
  // The optimizer's state (keyed by names()) as a one-process run keys it ("<param name>.<slot>").
  virtual io::NamedTensors full_optimizer_state(const io::NamedTensors& state) = 0;
  // The inverses: load full parameters (by model name) into this rank's parameters, masters and
  // shards, and cut a full optimizer state into the one this rank's optimizer loads.
  virtual void load_full_parameters(const io::NamedTensors& full, const std::string& source) = 0;
  virtual io::NamedTensors local_optimizer_state(const io::NamedTensors& full) = 0;

  // Sharded checkpoints: this rank's shards of the parameters (keyed by group) and of the optimizer's
  // state ("<group>.<slot>"; other optimizer keys as they are), and in `layout` how they cut into the
  // full tensors (see train/checkpoint.h). Not collective. Replicated targets hold no shards and throw.
  virtual io::NamedTensors local_shards(const io::NamedTensors& optimizer_state, nlohmann::json* layout);

  // This rank's model-state memory, given its optimizer's state.
  virtual ModelStateBytes model_state_bytes(const io::NamedTensors& optimizer_state) const = 0;
};

int64_t bytes_of(const torch::Tensor& t);

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

  // Copies rank 0's buffers (batch-norm running statistics) to every rank; collective. Each training forward
  // updates a rank's statistics from its own part of the batch, so after the last one the ranks differ
  // (under ddp too, whose broadcast comes before each forward), while a checkpoint keeps rank 0's: the
  // trainer calls this before every evaluation and every save, so that each rank evaluates with the
  // statistics the saved weights hold. Outside any captured step. One process: nothing to agree.
  virtual void sync_buffers() {}

  // Every rank's text in rank order (ProcessGroup::all_gather_text); one process has only its own.
  virtual std::vector<std::string> all_gather_text(const std::string& /*name*/, const std::string& text) {
    return {text};
  }

  // Why a whole step under this strategy cannot be captured as a CUDA graph (one line, for the run's log
  // and record), or "" when it can: its hooks must launch only device work, with no host waits.
  virtual std::string capture_obstacle() const {
    return "--strategy " + name() + " coordinates its collectives from the host";
  }

  // What the optimizer updates; called once, after prepare(). master_weights: the precision policy
  // wants fp32 masters of half parameters. The default serves replicated strategies: the model's
  // trainable parameters, or fp32 copies of them.
  virtual std::unique_ptr<UpdateTarget> update_target(models::Model& model, bool master_weights);
};

// The model's trainable parameters (or fp32 masters of them), identical on every rank.
std::unique_ptr<UpdateTarget> replicated_update_target(models::Model& model, bool master_weights);

// The strategy `spec` names with the options the plan resolved (train::Plan's strategy and
// strategy_options), its process group formed from the launch environment; gradients travel in
// precision.reduce_dtype.
std::unique_ptr<Strategy> make_strategy(const StrategySpec& spec, const StrategyOptions& options,
                                        const precision::PrecisionPolicy& precision, torch::Device device,
                                        const distributed::LaunchEnvironment& launch);

}  // namespace ptrain::strategies
