// `ptrain bench`: every run of a suite in its own process (so that each run's memory figures are its
// own), each run's record kept as a file, so that an interrupted bench continues where it stopped, and
// the report written at the end. With pytorch set, the same runs also go through PyTorch
// (bench/pytorch_reference.py), so that the report puts both side by side.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "ptrain/bench/report.h"

namespace ptrain::bench {

struct BenchOptions {
  std::string suite = "standard";  // a name under configs/bench, or a YAML file
  std::string source_dir;          // the ptrain checkout: configs/bench and bench/pytorch_reference.py
  std::string out_dir = "runs/bench";
  int64_t gpus = -1;               // GPUs to use; -1: every visible one; 0: the CPU
  bool pytorch = false;            // also run each run through PyTorch
  // Runs that need fewer GPUs than the machine has start side by side, each on GPUs of its own (a
  // two-GPU machine trains two one-GPU runs at once); a run needing every GPU still runs alone. Each
  // run's memory figures stay its own; the runs share the host's cores.
  bool side_by_side = false;
  std::string python = "python3";  // the Python that has torch (and torchvision) for the PyTorch runs
  // Before each ptrain run, `ptrain estimate` predicts its peak memory per device (two short probe runs),
  // and the report puts the prediction beside what the run measured.
  bool estimate = true;
  // Workload keys set from the command line ("max-steps=60"), over the suite file's: the same suite,
  // shortened or moved to other data, without copying the file. Recorded in bench.json.
  std::vector<std::pair<std::string, std::string>> overrides;
  // A run (with its estimate) still going after this many seconds is stopped and reported as failed, so
  // that one stuck run does not take the rest of the suite with it; 0: no limit.
  int64_t run_timeout_seconds = 0;
  // Runs left out, by id ("fp32-dp-x2": both frameworks) or framework and id ("pytorch/fp32-dp-x2").
  std::vector<std::string> skip;
  std::string ptrain_executable;   // the binary that trains (normally this one)
};

struct BenchOutcome {
  int completed = 0, done_earlier = 0, failed = 0, not_available = 0;
  std::vector<std::string> failures;  // "<framework> <run>: <reason>"
  WrittenReport report;
};

// Throws ptrain::Error for a bad suite or options before anything runs; a failing run is reported in the
// outcome (and its log kept) while the others go on. An interrupted run (Ctrl-C) stops the bench with
// ptrain::Error after keeping what finished.
BenchOutcome run_bench(const BenchOptions& options, std::ostream& progress);

}  // namespace ptrain::bench
