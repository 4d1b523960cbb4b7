// One plan, validated once: the config resolved into the device, precision policy, model, data and
// strategy a run will use, and the sections of plan_sections.h. Impossible combinations are refused here,
// naming the flag or key, never downgraded silently.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "ptrain/config/train_config.h"
#include "ptrain/distributed/launch_environment.h"
#include "ptrain/data/registry.h"
#include "ptrain/models/zoo.h"
#include "ptrain/precision/policy.h"
#include "ptrain/strategy_spec/strategy_spec.h"
#include "ptrain/train/plan_sections.h"
#include "ptrain/train/run/stop_rules.h"

namespace ptrain::train {

struct Plan {
  // The resolved config as config::to_json gives it: what the run's record keeps (extra.config), its checkpoints
  // carry and the ranks of a job compare, setting by setting. The run reads its values from the sections.
  nlohmann::json settings;
  ModelSetup model;
  data::DataSpec data;
  DataOptions data_options;
  // --epochs, --max-steps, --grad-accum and --batch-size (per device, --global-batch-size resolved).
  RunLength length;
  Optimization optimization;
  Cadence cadence;
  CheckpointOptions checkpoints;
  Reporting reporting;
  DeviceSetup device_setup;
  PrecisionFlags precision_flags;
  torch::Device device = torch::kCPU;
  // The one source of the run's dtypes (reduce_dtype: the dtype gradients travel in, --reduce-dtype
  // resolved) and of what the strategy does: nothing after make_plan reads the names again.
  precision::PrecisionPolicy precision;
  strategies::StrategySpec strategy;
  // The strategy's flags, parsed and checked: what strategies::make_strategy builds it from.
  strategies::StrategyOptions strategy_options;
  // --normalize resolved: the given values, or the dataset's default.
  data::Normalization normalization;
  std::string resume_path;  // resolved checkpoint file; empty: start fresh
  // What choosing resume_path left out ("--resume latest" passing over an abandoned branch); "" when nothing.
  std::string resume_note;
  // ptrain launch --max-restarts: the restarts of the job before this attempt and their causes (none on a
  // first attempt), and the line rank 0 prints about where this attempt starts ("" on a first attempt).
  distributed::RestartInfo restart;
  std::string restart_note;
  // The threads of this node's processes exceed its cores (distributed::oversubscription_warning); "" when not.
  std::string threads_warning;
  // The processes training together: detected from the launch environment under ddp, one otherwise.
  distributed::LaunchEnvironment launch;
  // --on-divergence resolved.
  OnDivergence on_divergence = OnDivergence::kStop;
  // --channels-last resolved: auto means on for convolutional models on CUDA.
  bool channels_last = false;
  // The library API (ptrain/ptrain.h): a model and data of the caller's own, used instead of the zoo's
  // and the dataset registry's when set.
  std::function<std::shared_ptr<models::Model>(const models::ModelSpec&)> make_model;
  std::function<data::Dataset(bool train)> open_data;
};

// names as --skip-fusions (or a suite run's skip-fusions, at where) gives them: each one of models::fusion_names(),
// once; throws an Error naming the first that is not, with the fusions that are.
void check_fusion_names(const std::vector<std::string>& names, const std::string& where);

// model_from_caller: the plan's make_model will be set, so config.model.name names no zoo model.
Plan make_plan(const config::TrainConfig& config, bool model_from_caller = false);

// The config as make_plan resolves it (a restarted job's --resume latest, the device of a launched process, dp's
// replicas, the threads, --global-batch-size's per-device batch), refused where make_plan refuses it: what a
// bench job is counted with (bench/preflight.h).
config::TrainConfig resolve_config(const config::TrainConfig& config);

// Sections of the plan that need nothing but the config, as make_plan makes them: what a bench job of another
// framework, which has no plan, is counted with too. optimizer_options throws ptrain::Error for an --optimizer
// other than sgd and adamw.
OptimizerOptions optimizer_options(const config::OptimizerConfig& optim);
ScheduleOptions schedule_options(const config::OptimizerConfig& optim);
RunLength run_length_of(const config::TrainConfig& config);
data::DataSpec data_spec(const config::DataConfig& data);
DataOptions data_options(const config::DataConfig& data);

// "A:B" -> {A, B} with 1 <= A <= B; throws ptrain::Error naming flag otherwise.
std::pair<int64_t, int64_t> parse_step_range(const std::string& text, const std::string& flag);

// A readable summary: what --dry-run prints and every run logs first.
std::string describe(const Plan& plan);

torch::Device resolve_device(const std::string& name);

}  // namespace ptrain::train
