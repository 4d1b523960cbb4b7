// The words bench/'s parts share: the options of a bench, what the Python of the PyTorch reference can do,
// and one job (a process of a run). A header of its own so that the parts the runner calls (jobs.h,
// preflight.h, bench_record.h) need not include the runner's.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ptrain/bench/suite.h"

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
  // Runs left out, by id ("fp32-dp-x2": every framework) or by the path of their record under runs/
  // ("pytorch/fp32-dp-x2": PyTorch eager's; "pytorch-compiled/...", "pytorch-compiled-default/..."; in a
  // suite of several workloads the id is "WORKLOAD/RUN", e.g. "ptrain/gpt2-small/fp32-single-x1").
  std::vector<std::string> skip;
  std::string ptrain_executable;   // the binary that trains (normally this one)
  // No run starts after this many seconds of the bench, and one still going then is stopped and left for
  // the next bench with the same --out; the report covers what finished. 0: no limit.
  int64_t time_limit_seconds = 0;
  // Each run's jobs this many times, in turn (ptrain, PyTorch, ptrain, PyTorch...), so that the report gives each
  // ratio as the median over the rounds with their range, and marks the figures the machine's load made noisy.
  int64_t repeat = 1;
};

// What the Python that runs the PyTorch reference can do, asked once per bench --pytorch before its first run:
// whether it imports what the reference does (torch, torchvision, numpy), and whether it can compile.
struct PytorchAbilities {
  bool known = false;          // the Python answered
  std::string torch_version;   // e.g. "2.11.0+cu130"
  bool has_compile = false;    // torch.compile exists (PyTorch 2.x)
  std::string torchvision_version, numpy_version;
  std::string problem;         // why the Python did not answer; empty when known
};
// One process of a bench: ptrain's run, or one PyTorch variant of it.
struct BenchJob {
  // Where its record goes under runs/: ptrain | pytorch (eager) | pytorch-compiled | pytorch-compiled-MODE.
  std::string framework;
  SuiteRun run;
  std::string command;     // shell command line; the GPUs it may see are set when it starts
  std::string metrics_path, log_path;
  std::string estimate_path;  // ptrain runs: where `ptrain estimate` leaves its prediction; empty: none
  std::string unavailable;    // why this job cannot run (PyTorch has no such mode); empty: it can
  // torch.compile's mode of a compiled PyTorch job; empty for the others. A record left by an earlier bench
  // in another mode is not this job's: it runs again.
  std::string compile_mode;
  // The `ptrain train` arguments of the run (of a PyTorch job: those of ptrain's run of the same job), from
  // which the bench makes every run's plan before the first one starts (bench/preflight.h).
  std::vector<std::string> train_arguments;
  int64_t processes = 1;  // processes the run starts (one per device under ddp, zero1-3 and fsdp)
  int64_t replicas = 1;   // devices each process drives (dp)
  int64_t repeat = 1;     // its round under --repeat, from 1
};

}  // namespace ptrain::bench
