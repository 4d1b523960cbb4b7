// --profile-out: the trace starts before step A and ends after step B (global steps counted from 1). Each
// traced step, its data loading included, is a range "ProfilerStep#N" (N the global step), as
// torch.profiler's schedule marks steps.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <torch/torch.h>

#include "ptrain/core/profiler_range.h"

namespace ptrain::train {

class ProfilerWindow {
 public:
  // out: the trace's file, "" for none; first_step..last_step the steps traced; announces: this rank says
  // where the trace went.
  ProfilerWindow(std::string out, int64_t first_step, int64_t last_step, const torch::Device& device, bool announces);

  // Before step `step` runs (its batches' loading included) and after it ran.
  void before_step(int64_t step);
  void after_step(int64_t step);
  // The run ended at last_step_done: a trace still open (before the last step asked for) is written as it is.
  void finish(int64_t last_step_done);

 private:
  std::string out_;
  int64_t first_step_, last_step_;
  torch::Device device_;
  bool announces_;
  bool tracing_ = false;
  std::optional<compat::ProfilerRange> traced_step_;  // ProfilerStep#N on the trace while step N runs
};

}  // namespace ptrain::train
