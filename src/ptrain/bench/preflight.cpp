#include "ptrain/bench/preflight.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <sstream>

#include <CLI/CLI.hpp>

#include "ptrain/config/cli_options.h"
#include "ptrain/config/deepspeed_config.h"
#include "ptrain/core/error.h"
#include "ptrain/data/registry.h"
#include "ptrain/data/sampler.h"
#include "ptrain/metrics/run_record.h"
#include "ptrain/train/plan.h"
#include "ptrain/train/schedule.h"

namespace ptrain::bench {

namespace {

std::string number_text(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// The variables `ptrain launch` gives rank 0 of a job of n processes, set while its plan is made here and
// put back after: make_plan reads the launch environment (the world size divides a global batch, picks
// each rank's GPU).
class AsRankZeroOf {
 public:
  explicit AsRankZeroOf(int64_t processes) {
    if (processes <= 1) return;
    set("RANK", "0");
    set("LOCAL_RANK", "0");
    set("WORLD_SIZE", std::to_string(processes));
    set("LOCAL_WORLD_SIZE", std::to_string(processes));
  }
  ~AsRankZeroOf() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }
  AsRankZeroOf(const AsRankZeroOf&) = delete;
  AsRankZeroOf& operator=(const AsRankZeroOf&) = delete;

 private:
  void set(const std::string& name, const std::string& value) {
    const char* old = std::getenv(name.c_str());
    saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

}  // namespace

RunLength run_length(const config::TrainConfig& c, int64_t train_samples, int64_t processes, int64_t replicas) {
  // The trainer's load_data: each process's loader takes batch x replicas samples a step from its share.
  const int64_t loader_batch = c.run.batch_size * replicas;
  check(train_samples >= loader_batch, "--batch-size " + std::to_string(c.run.batch_size) + " x " +
                                           std::to_string(replicas) + " replicas is larger than the " +
                                           std::to_string(train_samples) + " training samples");
  const data::DistributedSampler share(train_samples, 0, processes, /*shuffle=*/false, 0, /*drop_last=*/true);
  RunLength length;
  length.steps_per_epoch = share.num_samples() / loader_batch / c.optim.grad_accum;
  check(length.steps_per_epoch > 0, "--grad-accum " + std::to_string(c.optim.grad_accum) + " x --batch-size " +
                                        std::to_string(c.run.batch_size) + " is more than one epoch of data (" +
                                        std::to_string(share.num_samples()) + " samples per process)");
  length.total_steps = length.steps_per_epoch * c.run.epochs;
  if (c.run.max_steps > 0) length.total_steps = std::min(length.total_steps, c.run.max_steps);
  length.warmup_steps = c.optim.warmup_steps > 0
                            ? c.optim.warmup_steps
                            : static_cast<int64_t>(std::llround(c.optim.warmup_epochs *
                                                                static_cast<double>(length.steps_per_epoch)));
  if (length.warmup_steps > length.total_steps) {
    const std::string warmup = c.optim.warmup_steps > 0
                                   ? "--warmup-steps " + std::to_string(c.optim.warmup_steps)
                                   : "--warmup-epochs " + number_text(c.optim.warmup_epochs) + " is " +
                                         std::to_string(length.warmup_steps) + " optimizer steps (" +
                                         std::to_string(length.steps_per_epoch) + " an epoch), which";
    const bool capped = c.run.max_steps > 0 && c.run.max_steps < length.steps_per_epoch * c.run.epochs;
    throw Error(warmup + " is longer than the whole run of " + std::to_string(length.total_steps) + " steps (" +
                (capped ? "--max-steps " + std::to_string(c.run.max_steps)
                        : "--epochs " + std::to_string(c.run.epochs)) +
                "): shorten the warm-up (warmup-epochs, or warmup-steps with warmup-epochs 0) or lengthen the run");
  }
  // The schedule has the last word: whatever else it refuses, the run would refuse too.
  const train::LrSchedule schedule(c.optim, length.steps_per_epoch, std::max<int64_t>(length.total_steps, 1));
  (void)schedule;
  return length;
}

config::TrainConfig train_config_of(const std::vector<std::string>& arguments, int64_t world_size) {
  config::TrainConfig c;
  CLI::App app;
  CLI::Option* config_file = config::add_train_options(app, c);
  std::vector<std::string> reversed(arguments.rbegin(), arguments.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    throw Error(e.what());
  }
  if (config_file->count() > 0) config::apply_yaml_config(app, config_file->as<std::string>());
  if (!c.run.deepspeed_config.empty()) config::apply_deepspeed_config(app, c, c.run.deepspeed_config, world_size);
  return c;
}

int64_t training_samples(const config::TrainConfig& c) {
  data::DataSpec spec{c.data.dataset, c.data.path, c.data.seq_len};
  spec.image_loading = c.data.image_loading;
  spec.image_size = c.data.image_size;
  spec = data::resolve_image_loading(spec);
  const int threads = static_cast<int>(std::max<int64_t>(1, c.data.loader_threads));
  std::optional<int64_t> n;
  if (spec.image_loading == "memory") {
    // An image folder loaded whole holds the images its listing names; listing it, as streaming opens it,
    // counts them without decoding every one. CIFAR-10's binary release is not a folder: read below.
    data::DataSpec listed = spec;
    listed.image_loading = "stream";
    listed.image_size = std::max<int64_t>(1, spec.image_size);
    try {
      n = data::open_dataset(listed, /*train=*/true, threads).size();
    } catch (const Error&) {
    }
  }
  if (!n) n = data::open_dataset(spec, /*train=*/true, threads).size();
  return c.data.train_limit > 0 ? std::min(*n, c.data.train_limit) : *n;
}

int64_t Preflight::train_samples(const config::TrainConfig& c) {
  const DataKey key{c.data.dataset, c.data.path,         c.data.seq_len,
                    c.data.image_loading, c.data.image_size, c.data.train_limit};
  auto found = samples_.find(key);
  if (found == samples_.end()) {
    std::pair<int64_t, std::string> counted{0, ""};
    try {
      counted.first = training_samples(c);
    } catch (const std::exception& e) {
      counted.second = e.what();
    }
    found = samples_.emplace(key, counted).first;
  }
  if (!found->second.second.empty()) throw Error(found->second.second);
  return found->second.first;
}

std::string Preflight::refusal(const BenchJob& job) {
  try {
    config::TrainConfig c = train_config_of(job.train_arguments, job.processes);
    if (job.framework == metrics::kFrameworkPtrain) {
      const AsRankZeroOf rank_zero(job.processes);
      c = train::make_plan(c).config;  // e.g. a global batch resolved over the world
    }
    run_length(c, train_samples(c), job.processes, job.replicas);
    return "";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return what.substr(0, what.find('\n'));  // LibTorch's messages carry a stack on the lines after the first
  }
}

}  // namespace ptrain::bench
