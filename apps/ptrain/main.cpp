#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "ptrain/cli/cli.h"

int main(int argc, char** argv) {
  const int code = ptrain::cli::run_cli(argc, argv);
  // Everything the command opened is closed by now (run_cli's objects are gone), so the process ends without
  // the static destructors: LibTorch's deregister its thousands of operators one by one, about 80 ms of every
  // start-and-exit of 450 ms on the CPU build (perf, `ptrain --version`), paid by each rank, each bench run and
  // each test that runs the executable. The streams are flushed here, as exit() would have.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(code);
}
