// Before a bench starts its first run, each run's plan is made here, in the bench's own process, from the
// arguments its `ptrain train` will get (the workload file, the run's precision and strategy, the flags
// the bench adds): what make_plan refuses, data that cannot be read, a batch larger than an epoch, or a
// warm-up longer than the run would otherwise fail each run seconds after it started, one after another.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ptrain/bench/vocabulary.h"
#include "ptrain/config/train_config.h"
#include "ptrain/estimate/run_length.h"

namespace ptrain::bench {

// The config `ptrain train ARGUMENTS` trains: the flags, the --config file under them and a
// --deepspeed-config file (read for world_size processes). Throws ptrain::Error naming the flag or key.
config::TrainConfig train_config_of(const std::vector<std::string>& arguments, int64_t world_size);

class Preflight {
 public:
  // Why the job cannot train; empty when it can. ptrain's jobs: make_plan's refusal of the run's config, made
  // as its rank 0 makes it (under the launch environment of its processes), then the run's length on its
  // data. PyTorch's jobs train the same workload with the same schedule (bench/pytorch_reference.py
  // mirrors ptrain's), so their length is checked the same way.
  // length, when given, receives the run's steps where it can train (the bench's expected duration counts them).
  std::string refusal(const BenchJob& job, estimate::RunLength* length = nullptr);

 private:
  // Training samples per data source (dataset, path, sequence length, loading, image size, limit), read
  // once for every run of the workload; the error text when the data cannot be opened.
  using DataKey = std::tuple<std::string, std::string, int64_t, std::string, int64_t, int64_t>;
  std::map<DataKey, std::pair<int64_t, std::string>> samples_;
  int64_t train_samples(const config::TrainConfig& config);
};

}  // namespace ptrain::bench
