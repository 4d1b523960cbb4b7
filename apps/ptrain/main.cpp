#include "ptrain/cli/cli.h"

int main(int argc, char** argv) { return ptrain::cli::run_cli(argc, argv); }
