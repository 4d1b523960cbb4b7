// The run's --checkpoint-dir, owned for the run's life, and the writes into it (in the background under
// --async-checkpoint). One run at a time holds a directory (an exclusive
// lock on its .ptrain.lock, released when the process ends, however it ends); only the holder removes
// what killed writes left there; a fresh run never mixes its checkpoints with another run's, so
// --keep-checkpoints can never keep an old run's files over the new run's.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "ptrain/io/named_tensors.h"
#include "ptrain/train/checkpoint.h"
#include "ptrain/train/checkpoint_staging.h"

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
  // --async-checkpoint: write() and write_shard() copy the tensors to host memory and return; one background
  // thread writes them (atomically, as a synchronous write does), at most one write in flight. The thread
  // does file I/O only: whatever ranks must agree on happens in the caller's thread, at step boundaries.
  bool async = false;
};

// Test seam of --async-checkpoint: a background write whose temporary file is complete waits this many
// milliseconds before its rename, so that a test can SIGKILL (or SIGTERM) the run while the write is in
// flight, found by its temporary file. Unset in real runs.
inline constexpr const char* kTestWriteDelayVariable = "PTRAIN_TEST_CHECKPOINT_WRITE_DELAY_MS";
// Test seam of the part files (checkpoint.h): the least a part holds, in bytes, instead of
// kCheckpointPartBytes, so that a small run's checkpoints are written in parts. Unset in real runs.
inline constexpr const char* kTestPartBytesVariable = "PTRAIN_TEST_CHECKPOINT_PART_BYTES";

// A copy of tensors in host memory that later in-place updates of the originals cannot reach, complete when
// it returns (checkpoint_staging.h's copies, finished in the calling thread).
io::NamedTensors staged_on_host(const io::NamedTensors& tensors);

// The name of the lock file in a checkpoint directory.
inline constexpr const char* kCheckpointLockFile = ".ptrain.lock";

// A checkpoint, or one rank's shard file of one, taken at a step boundary and not yet written. Under
// --async-checkpoint its tensors are staged already (checkpoint_staging.h: the copies queued on the device),
// so that the checks before a save can wait for the device while the copies run; one dropped unwritten
// writes nothing.
class PendingWrite {
 public:
  PendingWrite(PendingWrite&&) = default;
  PendingWrite& operator=(PendingWrite&&) = default;

 private:
  friend class Checkpointer;
  PendingWrite() = default;
  struct Shard {
    int64_t rank = 0, ranks = 0;
    io::NamedTensors tensors;  // synchronous writes only: async ones are staged
    nlohmann::json layout;
  };
  std::string path;
  std::optional<Checkpoint> checkpoint;  // a checkpoint (async: without its tensors, which are staged)
  std::optional<Shard> shard;            // or a shard file
  std::shared_ptr<StagedSections> staged;
};

// Where a background write's seconds went: the same write as writes_seconds()' entry.
struct WritePhases {
  // Until every file of it was written and renamed, from the write's start.
  double files = 0;
  // Of those, queueing the copies from the device to host memory (begin_host_copies: a call to the driver for
  // each tensor) before any file is written.
  double copies_queued = 0;
  // Of those, summed over the threads that write the files: waiting for bytes still being copied from the
  // device (checkpoint_staging.h). Thread-seconds: up to kMaxCheckpointParts threads wait at once.
  double copies_waited = 0;
  // The previous write's --keep-checkpoints removals, which run beside the steps once that write is done: how
  // long they took, and how long this write's thread waited for them before its files (so that no more
  // checkpoints are ever on disk than with the removals inline).
  double pruning = 0;
  double pruning_waited = 0;
};

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
  // the next sequence of the directory), then applies --keep-checkpoints. Owner only. Async: first waits
  // for the write in flight (throwing its error, as wait() does), then stages and hands the write over.
  void write(const std::string& path, Checkpoint checkpoint);
  // write() in two halves: take() stages (async: first waiting for the write in flight, as write() does),
  // write(pending) writes or hands the write over. Between them the caller may still decide not to save.
  PendingWrite take(const std::string& path, Checkpoint checkpoint);
  PendingWrite take_shard(const std::string& path, int64_t rank, int64_t ranks, const io::NamedTensors& shards,
                          const nlohmann::json& layout);
  void write(PendingWrite pending);
  const std::string& run_id() const { return lineage_.run_id; }
  // This rank's shard file of the checkpoint at path (sharded checkpoints; every rank). Async as write().
  void write_shard(const std::string& path, int64_t rank, int64_t ranks, const io::NamedTensors& shards,
                   const nlohmann::json& layout);
  bool async() const { return options_.async; }
  // On a GPU: begins pinning the host memory that checkpoints of a state like this one are copied into
  // (checkpoint_staging.h's HostStagingArea: every save's, synchronous or not), in the background, so that the
  // first save does not pay for it. Nothing otherwise.
  void reserve_host_memory(const std::vector<io::NamedTensors>& sections);
  // Returns once no write is in flight. A background write that failed throws here (once): a ptrain::Error
  // naming the checkpoint, as a synchronous write's failure would have thrown from write().
  void wait();
  // wait(), then also for the last write's --keep-checkpoints removals, which otherwise run beside the steps
  // until the next write begins: at the run's end, so that what it keeps is what it leaves.
  void wait_all();
  // Whether a background write is in flight (or done and not yet waited for).
  bool writing() const { return worker_.joinable(); }
  // Where the last async write was staged (checkpoint_staging.h); none before the first.
  std::optional<StagingPlace> staging() const { return staging_; }
  // The pinned host blocks saves copied into (checkpoint_staging.h), in order: none on a CPU.
  std::vector<HostStagingArea::Pinning> staging_pinnings() const { return host_area_->pinnings(); }
  // Seconds background writes took, those waited for (async only; 0 otherwise).
  double write_seconds() const;
  // The same, write by write, in order.
  const std::vector<double>& writes_seconds() const { return writes_seconds_; }
  const std::vector<WritePhases>& writes_phases() const { return writes_phases_; }
  // The newest checkpoint this run wrote, once its write is done (and, async, waited for); empty before.
  const std::string& last_written() const { return last_written_; }
  int64_t last_written_step() const { return last_written_step_; }

 private:
  void lock();
  void refuse_or_remove_other_runs_checkpoints();
  // Runs job on the background thread, which records what it wrote (or its error) for wait().
  void start_write(const std::string& path, int64_t step, bool whole, std::function<void()> job);
  void write_shard_file(PendingWrite pending);
  std::function<void()> test_delay() const;
  // Begins staging a write's tensors (the training thread's half) and says where, when that changes.
  std::shared_ptr<StagedSections> stage(std::vector<io::NamedTensors> sections);

  CheckpointerOptions options_;
  Lineage lineage_;  // what every checkpoint of this run records; sequence: the last one written
  int lock_fd_ = -1;
  std::string last_written_;
  int64_t last_written_step_ = -1;

  // The write in flight: only its thread touches these until wait() joins it.
  std::thread worker_;
  struct Done {
    std::string path;
    int64_t step = -1;
    bool whole = false;  // a checkpoint (not a shard file): the newest this run wrote, once done
    double seconds = 0;
    WritePhases phases;
    std::exception_ptr error;
  } done_;
  // The --keep-checkpoints removals after the last write, beside the steps: started by that write's thread at
  // its end, joined by the next write's thread (or wait_all()); only those threads touch these.
  std::thread pruner_;
  double pruner_seconds_ = 0;
  std::exception_ptr pruner_error_;
  void prune_in_background();
  void join_pruner();
  std::vector<double> writes_seconds_;
  std::vector<WritePhases> writes_phases_;
  int64_t test_delay_ms_ = 0;
  int64_t part_bytes_ = kCheckpointPartBytes;
  std::shared_ptr<HostStagingArea> host_area_ = std::make_shared<HostStagingArea>();
  std::optional<StagingPlace> staging_;
};

}  // namespace ptrain::train
