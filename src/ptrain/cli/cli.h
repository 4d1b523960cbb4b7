// The `ptrain` command line: subcommands over libptrain. apps/ptrain/main.cpp only calls run_cli.
#pragma once

namespace ptrain::cli {

// ptrain's exit codes (README, "Exit codes"). A run stopped by signal N exits 128 + N (130 for Ctrl-C, 143
// for SIGTERM) once its checkpoint is saved, as a shell reports a process the signal ended; ptrain launch
// exits with the code of the first rank that failed.
constexpr int kExitSuccess = 0;
constexpr int kExitFailedRuns = 1;    // ptrain bench: a run failed, the others ran; ptrain launch: past --timeout
constexpr int kExitError = 2;         // a refusal or failure, named in one "ptrain: error:" line
constexpr int kExitLibTorchError = 3; // LibTorch's own error ("ptrain: LibTorch error:")

// Parses argv, runs the subcommand, and returns the process exit code. Errors are printed, not thrown.
int run_cli(int argc, char** argv);

}  // namespace ptrain::cli
