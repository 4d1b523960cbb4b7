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
};

void save_checkpoint(const std::string& path, const Checkpoint& checkpoint);
Checkpoint load_checkpoint(const std::string& path);

// "<dir>/step-<global_step>.safetensors", and the newest such file in dir (empty if none).
std::string checkpoint_path(const std::string& dir, int64_t global_step);
std::string latest_checkpoint(const std::string& dir);

}  // namespace ptrain::train
