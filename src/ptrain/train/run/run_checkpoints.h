// What a run keeps across processes: its --checkpoint-dir (resume, the saves, --async-checkpoint's writes in
// flight and what they cost the steps) and --save-weights. A state that is not finite is never written. The
// tensors come from the parts that own them, as named states (CheckpointedState): this part decides when and
// where they are written, never how a strategy gathers or shards them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "ptrain/io/named_tensors.h"
#include "ptrain/metrics/run_record.h"
#include "ptrain/train/checkpoint.h"
#include "ptrain/train/checkpointer.h"
#include "ptrain/train/run/stop_rules.h"

namespace ptrain::train {

// The run's state as a checkpoint holds it, given by the parts that own it. Every rank calls each at the
// same step boundary, in the same order: gathering shards and summing over ranks are collectives.
class CheckpointedState {
 public:
  virtual ~CheckpointedState() = default;
  // The model's state_dict as this rank holds it: the buffers, and parameters a strategy may have sharded.
  virtual io::NamedTensors model_state() = 0;
  // Every parameter whole, the fp32 masters where there are any.
  virtual io::NamedTensors full_parameters() = 0;
  virtual io::NamedTensors full_optimizer_state() = 0;
  // The optimizer's state as this rank holds it (its shard, where the strategy shards it).
  virtual io::NamedTensors optimizer_state() = 0;
  // This rank's shards of parameters and optimizer state (--state-dict sharded), and their layout.
  virtual io::NamedTensors local_shards(nlohmann::json* layout) = 0;
  virtual io::NamedTensors scaler_state() = 0;  // empty without a loss scaler
  // The epoch's running sums over every rank, so that a resumed epoch's metrics count what came before.
  virtual io::NamedTensors progress_totals() = 0;
  // Rank 0's buffers on every rank: the statistics a saved state evaluates with are the ones every rank used.
  virtual void sync_buffers() = 0;
  // Whether every rank's parameters (and masters, shards) and buffers are finite.
  virtual bool finite() = 0;
  // Reads the divergence watch, which may end the run: a diverged state is never saved.
  virtual void check_divergence() = 0;
  // Takes back a checkpoint's model, optimizer, scaler and progress (source names it in errors).
  virtual void load(const Checkpoint& checkpoint, const std::string& source) = 0;
};

class RunCheckpoints {
 public:
  struct Options {
    std::string dir;  // --checkpoint-dir; "" for none
    int64_t keep = 0;
    bool overwrite = false, async = false, sharded = false;
    std::string resume_path;   // the checkpoint resumed, "" for a fresh run
    std::string save_weights;  // --save-weights; "" for none
    nlohmann::json run_config;  // what a checkpoint records as the run that wrote it
    // The layout a position is counted in: devices sharing a step, and the batch of each.
    int64_t devices = 1, batch_size = 0;
    torch::Device device = torch::kCPU;
    int64_t rank = 0, world_size = 1;
    bool is_main = true;  // the rank that owns the directory and writes the files others' shards hang off
    std::function<void(torch::Tensor&)> sum_over_ranks;
  };
  // The run a resumed checkpoint must fit: the steps left to train, its epochs' windows.
  struct RunShape {
    int64_t grad_accum = 1, steps_per_epoch = 0, total_steps = 0, micro_batches_per_epoch = 0;
    bool restarted = false;  // a restarted job may resume at the run's end (its evaluation and outputs left)
    std::string run_length;  // which flag set the run's last step, for the errors
  };

  RunCheckpoints(Options options, CheckpointedState& state, StopRules& stop_rules);

  // Takes --checkpoint-dir for the run: first of all, so that a directory another run holds is refused
  // before any work.
  void open();
  bool enabled() const { return checkpointer_ != nullptr; }
  // --async-checkpoint on a GPU: the host memory its saves copy the state into, pinned in the background
  // while the run warms up rather than by the first save's write (checkpoint_staging.h). Once resumed.
  void reserve_staging();

  // Loads --resume's checkpoint into the state and returns where the run continues: the same sample of its
  // epoch at a step boundary of this run's layout. Refuses one this run has nothing left to train after;
  // warns when the schedule's settings changed.
  TrainingPosition resume(const RunShape& shape);

  // A checkpoint of this position (rank agreement and gathering happen here, in the training thread); under
  // --async-checkpoint it returns once the state is staged in host memory, and its time counts as blocked.
  void save(TrainingPosition position);
  // Waits for what the saves handed over: the run's end, its last checkpoint, a stop by signal. Collective.
  // Nothing without --async-checkpoint.
  void finish_writes();
  // A failing run's last word on its writes: waits for the one in flight, returns its error ("" for none).
  std::string wait_quietly();
  // --save-weights after step `step`: refused (and said) when the weights are not finite.
  void export_weights(int64_t step);

  // The newest checkpoint written, "" before the first, and its step.
  std::string last_written() const;
  int64_t last_written_step() const;
  // "weights in w.pt and checkpoint ck/step-00000008.safetensors (step 8)", or "" when nothing was written.
  std::string what_was_kept() const;
  // Why nothing was kept: "no --checkpoint-dir or --save-weights", or what the flags given did not write.
  std::string why_nothing_was_kept() const;
  // run_end's checkpoint, weights and weights_refused.
  void describe_end(nlohmann::json& run_end) const;
  // What checkpoints cost the steps and how their writes went, into the run's record.
  void record(metrics::RunRecord& record) const;

 private:
  // --async-checkpoint: waits for this rank's write in flight and agrees with every rank that theirs
  // succeeded (collective: every rank calls it at the same boundary); a failure anywhere throws on every
  // rank. Then rank 0 hands over the file that names the shards of the last sharded save, which may
  // appear only now that every shard is on disk.
  void settle_writes();
  void write_checkpoint(TrainingPosition position);
  // The divergence check, then whether the state is finite (collective); false: nothing may be saved (said).
  bool fit_to_save(int64_t global_step);

  Options options_;
  CheckpointedState& state_;
  StopRules& stop_rules_;
  std::unique_ptr<Checkpointer> checkpointer_;
  // --async-checkpoint, rank 0 of a sharded save: its checkpoint file, staged, to write once every rank's
  // shard is known written (settle_writes).
  std::optional<std::pair<std::string, Checkpoint>> pending_checkpoint_;
  // The training thread inside each save() and in finish_writes(): what checkpoints cost the steps.
  struct Blocking {
    std::vector<double> saves;
    std::vector<double> waits;  // the part of each save spent waiting for the write before it
    double end_wait = 0;
    double total() const;
  } blocking_;
  bool weights_exported_ = false;  // --save-weights written (by rank 0; the other ranks only gather)
  bool weights_refused_ = false;   // --save-weights not written: the weights were not finite
};

}  // namespace ptrain::train
