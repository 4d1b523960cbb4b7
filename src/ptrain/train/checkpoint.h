// Training checkpoints: a safetensors file holding the model, optimizer and loss-scaler state and where the
// run stood, written atomically (a crash mid-write leaves the previous checkpoint intact). A large one keeps
// its tensors in part files beside it, which it names (CheckpointWrite below).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

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

// Where a checkpoint stands among the runs that wrote its directory, which --resume latest follows: a run
// resumed from an older checkpoint starts a new line there, and the later checkpoints of the line it left
// are an abandoned branch. Checkpoints written before lineage was recorded have none (run_id empty,
// sequence 0) and count as written before any that has one.
struct Lineage {
  std::string run_id;          // the run that wrote it (random, one per run)
  int64_t sequence = 0;        // the order of writes in its directory: 1 + the highest sequence there then
  // The checkpoint its run resumed from: that checkpoint's run id ("" when it has no lineage) and step;
  // parent_step -1: a fresh run.
  std::string parent_run_id;
  int64_t parent_step = -1;
  std::string parent_file;     // the parent's file name, for people reading the metadata
};

struct Checkpoint {
  TrainingPosition position;
  Lineage lineage;
  io::NamedTensors model;       // full-precision weights (the fp32 masters when there are any) and buffers
  io::NamedTensors optimizer;
  io::NamedTensors scaler;
  io::NamedTensors progress;    // running sums of the epoch in progress, so its metrics survive a resume
  nlohmann::json run;           // the config that produced it, for the record
  int64_t shards = 0;           // sharded: rank files beside this one hold the sharded tensors
  int64_t parts = 0;            // as loaded: the part files that held its tensors (0: none, all in the one file)
  std::string format_version;   // as loaded ("1": written before checkpoints had checksums)
};

// One file takes about 3 GB/s however many threads write it, even into memory (the kernel's lock on it), and
// an --async-checkpoint of GPT-2 large (9.4 GB every 2 s) needs more. So a checkpoint of at least two parts'
// worth of tensor bytes is written as up to kMaxCheckpointParts part files at once, one thread each, as PyTorch
// DCP's file system writer does: "<stem>.part-<i>-<tag>.safetensors" beside it, each with its own checksum, and
// then the checkpoint file itself, which names them with their checksums and holds no tensors. The tag is new
// for every write, so rewriting a step's checkpoint never touches the parts its old file names until the new
// file has replaced it. Below two parts' worth, the one file holds everything, as before.
inline constexpr int64_t kCheckpointPartBytes = int64_t{256} << 20;
inline constexpr int64_t kMaxCheckpointParts = 8;

struct CheckpointWrite {
  // io::write_file_atomically's test seam (train/checkpointer.h holds writes open with it): for the
  // checkpoint file, written last.
  std::function<void()> before_rename;
  // io::write_safetensors's, for tensors whose bytes are still arriving (an async save's).
  std::function<void(std::string_view)> before_reading;
  int64_t part_bytes = kCheckpointPartBytes;  // the least a part holds (tests make it small)
};

void save_checkpoint(const std::string& path, const Checkpoint& checkpoint, const CheckpointWrite& write = {});
// A sharded checkpoint loads whole: the shards' tensors are reassembled into full parameters and
// optimizer state, so that it loads into any strategy at any world size, as a full one does.
Checkpoint load_checkpoint(const std::string& path);

// "crc32:XXXXXXXX" of the model's tensors (names, dtypes, shapes and values, in name order): equal for two
// checkpoints with the same weights whatever else differs (the config, the position, the optimizer state).
std::string weights_digest(const Checkpoint& checkpoint);

// Sharded checkpoints (--state-dict sharded): every rank writes its shards (strategies::UpdateTarget::
// local_shards) to shard_path(path, rank), then rank 0 writes the checkpoint at `path` with shards set
// and without the sharded tensors. The checkpoint at `path` exists only once every shard does.
std::string shard_path(const std::string& path, int64_t rank);
void save_shard(const std::string& path, int64_t rank, int64_t ranks, const io::NamedTensors& shards,
                const nlohmann::json& layout, const std::function<void()>& before_rename = {},
                const std::function<void(std::string_view)>& before_reading = {});

// One rank file alone, as `ptrain verify` checks it: a shard file with its checksum (verified), its rank
// and the ranks; ptrain::Error naming path when it is none. Loading the checkpoint reassembles them all.
struct ShardFile {
  int64_t rank = 0, ranks = 0;
  io::NamedTensors tensors;
};
ShardFile load_shard(const std::string& path);
// Whether path is named as a rank file (shard_path's "<checkpoint>.rank-NNNNN.safetensors").
bool named_as_shard(const std::string& path);

// One part file alone, as `ptrain verify` checks it: its checksum (verified), its index and the parts;
// ptrain::Error naming path when it is none. Loading the checkpoint that names it reads them all.
struct PartFile {
  int64_t part = 0, parts = 0;
  std::string checksum;  // its "ptrain_checksum", which the checkpoint that names it lists
  io::NamedTensors tensors;
};
PartFile load_part(const std::string& path);
// Whether path is named as a part file ("<checkpoint stem>.part-<i>-<tag>.safetensors").
bool named_as_part(const std::string& path);

// A checkpoint's step and lineage, read from its header alone.
struct CheckpointHeader {
  int64_t global_step = 0;
  Lineage lineage;
};
CheckpointHeader read_checkpoint_header(const std::string& path);

// "<dir>/step-<global_step>.safetensors". A name whose step does not fit int64 is refused wherever dir is
// listed (ptrain::Error naming the file).
std::string checkpoint_path(const std::string& dir, int64_t global_step);

// What --resume latest takes in dir: the newest checkpoint of the current line, the line of the checkpoint
// written last (without lineage anywhere: the highest step). passed_over: checkpoints of later steps on
// other lines (an abandoned branch), oldest first, left where they are and never taken by latest.
struct LatestCheckpoint {
  std::string path;  // empty: no checkpoint in dir
  std::vector<std::string> passed_over;
};
LatestCheckpoint find_latest_checkpoint(const std::string& dir);
std::string latest_checkpoint(const std::string& dir);  // find_latest_checkpoint(dir).path
// The highest sequence of the checkpoints in dir (0 when none has lineage): the next one written gets more.
int64_t highest_sequence(const std::string& dir);

// The checkpoints in dir ("step-N.safetensors", not their rank or part files), oldest first.
std::vector<std::string> list_checkpoints(const std::string& dir);
// Removes a checkpoint with its rank and part files: the rank files first (a checkpoint whose shards are gone
// must not stay behind looking whole), the part files last (a removal cut short leaves parts that no
// checkpoint names, which remove_stale_temporaries takes). Returns whether the checkpoint itself was removed.
bool remove_checkpoint(const std::string& path);

// Removes what interrupted checkpoint writes and removals leave and returns how many files it removed: the
// temporary files of writes killed before their rename ("step-N[.rank-R|.part-I-TAG].safetensors.tmp.XXXXXX")
// and part files that no checkpoint in dir names. Call it only while nothing writes into dir: the run holding
// its lock (train/checkpointer.h), at its start.
int64_t remove_stale_temporaries(const std::string& dir);

// --keep-checkpoints: removes all but the `keep` checkpoints in dir written last (with their rank files;
// those without lineage count as written first, by step), never `protect` (the checkpoint the run resumed
// from); keep 0 removes nothing. Returns the removed paths. An abandoned branch's checkpoints, written
// before the current line's, go first.
std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep, const std::string& protect);

}  // namespace ptrain::train
