#include "ptrain/bench/preflight.h"

#include <cstdlib>
#include <optional>

#include <CLI/CLI.hpp>

#include "ptrain/config/cli_options.h"
#include "ptrain/config/deepspeed_config.h"
#include "ptrain/core/error.h"
#include "ptrain/metrics/run_record.h"
#include "ptrain/train/plan.h"

namespace ptrain::bench {

namespace {

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

int64_t Preflight::train_samples(const config::TrainConfig& c) {
  const DataKey key{c.data.dataset, c.data.path,         c.data.seq_len,
                    c.data.image_loading, c.data.image_size, c.data.train_limit};
  auto found = samples_.find(key);
  if (found == samples_.end()) {
    std::pair<int64_t, std::string> counted{0, ""};
    try {
      counted.first = estimate::training_samples(train::data_spec(c.data), train::data_options(c.data));
    } catch (const std::exception& e) {
      counted.second = e.what();
    }
    found = samples_.emplace(key, counted).first;
  }
  if (!found->second.second.empty()) throw Error(found->second.second);
  return found->second.first;
}

std::string Preflight::refusal(const BenchJob& job, estimate::RunLength* length) {
  try {
    config::TrainConfig c = train_config_of(job.train_arguments, job.processes);
    if (job.framework == metrics::kFrameworkPtrain) {
      const AsRankZeroOf rank_zero(job.processes);
      c = train::resolve_config(c);  // e.g. a global batch resolved over the world
    }
    const estimate::RunLength counted = estimate::run_length(train::run_length_of(c), train::schedule_options(c.optim),
                                                             train_samples(c), job.processes, job.replicas);
    if (length) *length = counted;
    return "";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return what.substr(0, what.find('\n'));  // LibTorch's messages carry a stack on the lines after the first
  }
}

}  // namespace ptrain::bench
