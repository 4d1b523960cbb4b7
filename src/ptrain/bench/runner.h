// `ptrain bench`: every run of a suite in its own process (so that each run's memory figures are its
// own), each run's record kept as a file, so that an interrupted bench continues where it stopped, and
// the report written at the end. With pytorch set, the same runs also go through PyTorch
// (bench/pytorch_reference.py) in the variants each run asks for (eager, compiled), so that the report
// puts them side by side.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "ptrain/bench/suite.h"
#include "ptrain/bench/vocabulary.h"
#include "ptrain/report/report.h"

namespace ptrain::bench {

struct BenchOutcome {
  int completed = 0, done_earlier = 0, failed = 0, not_available = 0;
  int left_for_later = 0;  // not run, or stopped, at the time limit: the next bench runs them
  // Runs whose `ptrain estimate` left no prediction (the run itself went on, and counts as it ended), and for
  // each "<run>: <the estimate's error line>".
  int estimates_failed = 0;
  std::vector<std::string> estimate_failures;
  // "<framework> <run>: <reason>"; for a run that failed, the reason carries its processes' own error line
  // (failure_line.h: the failing rank's "ptrain: error:", a Python exception), not the launcher's last words.
  std::vector<std::string> failures;
  ptrain::report::WrittenReport report;
};

// Asks python, once per bench --pytorch before its first run, what it can do for the PyTorch reference.
PytorchAbilities probe_pytorch(const std::string& python);

// The jobs of the suite in order (per run entry: ptrain's, then its PyTorch variants when o.pytorch), with
// their command lines, under out_dir (absolute). pytorch says what the reference's Python can do; compiled
// variants are unavailable where it has no torch.compile.
std::vector<BenchJob> plan_jobs(const Suite& suite, const BenchOptions& o, const std::string& out_dir,
                                const PytorchAbilities& pytorch);

// Throws ptrain::Error for a bad suite or options before anything runs, and when no run left to run can
// train (bench/preflight.h: every one refused, e.g. its warm-up longer than the run), naming the runs and
// the reason, with nothing started. A run that cannot train beside others that can is reported as failed
// at once and never started; a failing run is reported in the outcome (and its log kept) while the others
// go on. An interrupted run (Ctrl-C) stops the bench with ptrain::Error after keeping what finished.
BenchOutcome run_bench(const BenchOptions& options, std::ostream& progress);

}  // namespace ptrain::bench
