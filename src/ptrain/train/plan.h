// One plan, validated once: the config resolved into the device, precision policy, model, data and
// strategy a run will use. Impossible combinations are refused here, naming the flag or key, never
// downgraded silently.
#pragma once

#include <string>
#include <utility>

#include <torch/torch.h>

#include "ptrain/config/train_config.h"
#include "ptrain/dist/environment.h"
#include "ptrain/data/registry.h"
#include "ptrain/precision/policy.h"

namespace ptrain::train {

struct Plan {
  config::TrainConfig config;
  torch::Device device = torch::kCPU;
  precision::PrecisionPolicy precision;
  data::DataSpec data;
  std::string resume_path;  // resolved checkpoint file; empty: start fresh
  // The processes training together: detected from the launch environment under ddp, one otherwise.
  dist::LaunchEnvironment launch;
  // --channels-last resolved: auto means on for convolutional models on CUDA.
  bool channels_last = false;
  // --profile-out traces optimizer steps profile_first_step..profile_last_step (1-based, inclusive).
  int64_t profile_first_step = 0, profile_last_step = 0;
};

Plan make_plan(const config::TrainConfig& config);

// "A:B" -> {A, B} with 1 <= A <= B; throws ptrain::Error naming flag otherwise.
std::pair<int64_t, int64_t> parse_step_range(const std::string& text, const std::string& flag);

// A readable summary: what --dry-run prints and every run logs first.
std::string describe(const Plan& plan);

torch::Device resolve_device(const std::string& name);

}  // namespace ptrain::train
