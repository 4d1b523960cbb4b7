// The run's --checkpoint-dir, owned for the run's life. One run at a time holds a directory (an exclusive
// lock on its .ptrain.lock, released when the process ends, however it ends); only the holder removes
// what killed writes left there; a fresh run never mixes its checkpoints with another run's, so
// --keep-checkpoints can never keep an old run's files over the new run's.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "ptrain/io/named_tensors.h"
#include "ptrain/train/checkpoint.h"

namespace ptrain::train {

struct CheckpointerOptions {
  std::string dir;
  int64_t keep = 0;           // --keep-checkpoints: the newest N stay; 0: all
  std::string resumed_from = "";  // the checkpoint the run continues (never removed); empty: a fresh run
  bool overwrite = false;     // --overwrite-checkpoints: a fresh run removes another run's checkpoints first
  // The rank that writes the checkpoint files others' shards hang off (rank 0) owns the directory: it
  // locks it, cleans it up and prunes it. The other ranks of its job only write their shard files there;
  // they need no lock of their own, and a second job is refused by its own rank 0.
  bool owner = true;
};

// The name of the lock file in a checkpoint directory.
inline constexpr const char* kCheckpointLockFile = ".ptrain.lock";

class Checkpointer {
 public:
  // Takes the directory (creating it): throws ptrain::Error naming it when another live run holds it
  // (and which: pid and host), or when it holds checkpoints of another run that this one neither resumes
  // nor may overwrite.
  explicit Checkpointer(CheckpointerOptions options);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  const std::string& dir() const { return options_.dir; }
  std::string path_for(int64_t global_step) const { return checkpoint_path(options_.dir, global_step); }
  // Writes the checkpoint (atomically) with this run's lineage (its run id, the checkpoint it resumed from,
  // the next sequence of the directory), then applies --keep-checkpoints. Owner only.
  void write(const std::string& path, Checkpoint checkpoint);
  const std::string& run_id() const { return lineage_.run_id; }
  // This rank's shard file of the checkpoint at path (sharded checkpoints; every rank).
  void write_shard(const std::string& path, int64_t rank, int64_t ranks, const io::NamedTensors& shards,
                   const nlohmann::json& layout);
  // The newest checkpoint this run wrote; empty before the first.
  const std::string& last_written() const { return last_written_; }
  int64_t last_written_step() const { return last_written_step_; }

 private:
  void lock();
  void refuse_or_remove_other_runs_checkpoints();

  CheckpointerOptions options_;
  Lineage lineage_;  // what every checkpoint of this run records; sequence: the last one written
  int lock_fd_ = -1;
  std::string last_written_;
  int64_t last_written_step_ = -1;
};

}  // namespace ptrain::train
