// Training checkpoints: one safetensors file holding the model, optimizer and loss-scaler state and
// where the run stood, written atomically (a crash mid-write leaves the previous checkpoint intact).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "ptrain/io/named_tensors.h"

namespace ptrain::train {

struct TrainingPosition {
  int64_t epoch = 0;            // the epoch in progress (0-based)
  int64_t micro_batch = 0;      // the next micro-batch of that epoch to run
  int64_t global_step = 0;      // optimizer steps completed
  // The layout micro_batch counts in: a run resumed with other values continues from the same sample.
  int64_t world_size = 1;       // devices sharing each step (processes x dp replicas)
  int64_t batch_size = 0;       // per device
};

struct Checkpoint {
  TrainingPosition position;
  io::NamedTensors model;       // full-precision weights (the fp32 masters when there are any) and buffers
  io::NamedTensors optimizer;
  io::NamedTensors scaler;
  io::NamedTensors progress;    // running sums of the epoch in progress, so its metrics survive a resume
  nlohmann::json run;           // the config that produced it, for the record
  int64_t shards = 0;           // sharded: rank files beside this one hold the sharded tensors
};

void save_checkpoint(const std::string& path, const Checkpoint& checkpoint);
// A sharded checkpoint loads whole: the shards' tensors are reassembled into full parameters and
// optimizer state, so that it loads into any strategy at any world size, as a full one does.
Checkpoint load_checkpoint(const std::string& path);

// Sharded checkpoints (--state-dict sharded): every rank writes its shards (strategies::UpdateTarget::
// local_shards) to shard_path(path, rank), then rank 0 writes the checkpoint at `path` with shards set
// and without the sharded tensors. The checkpoint at `path` exists only once every shard does.
std::string shard_path(const std::string& path, int64_t rank);
void save_shard(const std::string& path, int64_t rank, int64_t ranks, const io::NamedTensors& shards,
                const nlohmann::json& layout);

// "<dir>/step-<global_step>.safetensors", and the newest such file in dir (empty if none).
std::string checkpoint_path(const std::string& dir, int64_t global_step);
std::string latest_checkpoint(const std::string& dir);

}  // namespace ptrain::train
