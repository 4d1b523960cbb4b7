// The report's training curves per optimizer step: a ptrain run's --log-jsonl file (the runner writes
// <record>.log.jsonl beside each record) gives its loss and throughput at every logged step; a run without
// one (a PyTorch reference run, an older record) gives one point an epoch, placed at the epoch's last step.
// Internal to report/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ptrain::report {

struct ReportRun;

// One "step" record of a --log-jsonl file.
struct LoggedStep {
  int64_t step = 0;
  std::optional<double> loss;        // train/loss; none when not finite (null)
  std::optional<double> throughput;  // train/images_per_s or train/tokens_per_s
  bool tokens = false;               // throughput counts tokens
};

// A chart's point: x (an optimizer step, or seconds), the value, and what its tooltip says of x.
struct CurvePoint {
  double x = 0, value = 0;
  std::string where;
};

// The log the runner writes beside a record: run.json -> run.log.jsonl.
std::string step_log_path_of(const std::string& record_path);
// The "step" records of a --log-jsonl file, in order; empty when there is no such file. Lines that do not
// parse (the last line of a run killed while writing it) are skipped.
std::vector<LoggedStep> read_step_log(const std::string& path);

// Training loss against the optimizer step: every logged step where the run has a log, else each epoch's
// mean loss at the epoch's last step (from its images and the global batch).
std::vector<CurvePoint> loss_per_step(const ReportRun& run);
// Throughput against the optimizer step, from the log only (none without one).
std::vector<CurvePoint> throughput_per_step(const ReportRun& run);

}  // namespace ptrain::report
