// The scalars a run logs as it trains (loss, learning rate, loss scale, gradient norm, throughput, memory
// at each progress read; evaluation at each epoch's end), to TensorBoard (--tensorboard DIR) and as JSON
// lines (--log-jsonl FILE). Both are flushed record by record, so that a crashed run keeps what it logged.
// Logs are auxiliary: a write that fails (a full disk) warns once, naming the file and the OS's reason, and
// the run goes on without that log, so that it still saves its checkpoints, weights and record.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ptrain/metrics/tensorboard_writer.h"

namespace ptrain::metrics {

// Seconds since the Unix epoch: the wall_time of TensorBoard's events and of the JSON lines.
double unix_seconds();

class ScalarLog {
 public:
  // Empty tensorboard_dir or jsonl_path: that output is off. resumed_after: the optimizer step a resumed run
  // continues from; what an earlier run logged after it (steps trained again now) is dropped from the JSON
  // lines and hidden from TensorBoard, and what it logged up to it is kept. A fresh run starts the JSON
  // lines file anew. Throws ptrain::Error naming the flag and path of an output it cannot open.
  ScalarLog(const std::string& tensorboard_dir, const std::string& jsonl_path, std::optional<int64_t> resumed_after);
  ~ScalarLog();
  ScalarLog(const ScalarLog&) = delete;
  ScalarLog& operator=(const ScalarLog&) = delete;

  // One record: kind "step" (a progress read) or "epoch" (an epoch's end); step: optimizer steps done;
  // epoch: epochs done, fractional inside an epoch.
  // Never throws for a failed write: that log is given up (above).
  void log(const std::string& kind, int64_t step, double epoch, const Scalars& scalars);

  const std::string& tensorboard_file() const;
  // The flags of the logs given up after a failed write, in the order they failed.
  const std::vector<std::string>& failed() const { return failed_; }

 private:
  void give_up(const std::string& flag, const std::string& message);

  std::vector<std::string> failed_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::string jsonl_path_;
  std::FILE* jsonl_ = nullptr;
};

}  // namespace ptrain::metrics
