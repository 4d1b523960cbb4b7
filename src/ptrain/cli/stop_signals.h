// SIGTERM (Slurm's preemption, a scheduler's stop) and SIGINT (Ctrl-C) during `ptrain train`: the first
// asks the run to stop at its next step boundary, where it saves a checkpoint and its record; a second
// ends the process at once, as if nothing had caught the first. A signal the process inherited as
// ignored stays ignored.
#pragma once

namespace ptrain::cli {

class StopSignals {
 public:
  // Installs the handlers; the destructor puts back the ones it replaced.
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received, or 0.
  static int received();
};

}  // namespace ptrain::cli
