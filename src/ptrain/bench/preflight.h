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

#include "ptrain/bench/runner.h"
#include "ptrain/config/train_config.h"

namespace ptrain::bench {

// The optimizer steps a run trains, as its trainer counts them.
struct RunLength {
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;   // every epoch's, or --max-steps when fewer
  int64_t warmup_steps = 0;  // --warmup-steps, or --warmup-epochs of an epoch's steps
};

// The steps of a run on train_samples training samples, spread over `processes` processes (each takes
// its share, as the distributed sampler deals it) and `replicas` devices per process (dp). Throws
// ptrain::Error naming the flags, with the trainer's and the schedule's own words, where the run cannot
// train: a batch larger than the data, an epoch without a step, a warm-up longer than the run.
RunLength run_length(const config::TrainConfig& config, int64_t train_samples, int64_t processes, int64_t replicas);

// The training samples a run of config trains on (after --train-limit), counted as cheaply as its data
// allows (an image folder's listing, not its decoded images). Throws ptrain::Error when the data cannot be
// opened. With run_length, what `--dry-run` and `ptrain estimate` check of a run's data, as training will.
int64_t training_samples(const config::TrainConfig& config);

// The config `ptrain train ARGUMENTS` trains: the flags, the --config file under them and a
// --deepspeed-config file (read for world_size processes). Throws ptrain::Error naming the flag or key.
config::TrainConfig train_config_of(const std::vector<std::string>& arguments, int64_t world_size);

class Preflight {
 public:
  // Why the job cannot train; empty when it can. ptrain's jobs: make_plan's refusal of the run's config, made
  // as its rank 0 makes it (under the launch environment of its processes), then the run's length on its
  // data. PyTorch's jobs train the same workload with the same schedule (bench/pytorch_reference.py
  // mirrors ptrain's), so their length is checked the same way.
  std::string refusal(const BenchJob& job);

 private:
  // Training samples per data source (dataset, path, sequence length, loading, image size, limit), read
  // once for every run of the workload; the error text when the data cannot be opened.
  using DataKey = std::tuple<std::string, std::string, int64_t, std::string, int64_t, int64_t>;
  std::map<DataKey, std::pair<int64_t, std::string>> samples_;
  int64_t train_samples(const config::TrainConfig& config);
};

}  // namespace ptrain::bench
