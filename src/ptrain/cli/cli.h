// The `ptrain` command line: subcommands over libptrain. apps/ptrain/main.cpp only calls run_cli.
#pragma once

namespace ptrain::cli {

// Parses argv, runs the subcommand, and returns the process exit code. Errors are printed, not thrown.
int run_cli(int argc, char** argv);

}  // namespace ptrain::cli
