// Running the oracle Python (Debian's python3 with torch and torchvision, PTRAIN_ORACLE_PYTHON) on the
// scripts of tests/oracles: the independent references the tests compare ptrain with.
#pragma once

#include <string>

#include "command.h"

namespace ptrain::testing {

inline std::string oracle_script(const std::string& name) {
  return std::string(PTRAIN_SOURCE_DIR) + "/tests/oracles/" + name;
}

// `PTRAIN_ORACLE_PYTHON tests/oracles/<script> <args>`; stderr folded into the output (so that a failing
// oracle explains itself in the assertion message) unless asked otherwise.
inline CommandResult run_oracle(const std::string& script, const std::string& args,
                                Stderr stderr_mode = Stderr::Merged) {
  return run_command(std::string(PTRAIN_ORACLE_PYTHON) + " " + oracle_script(script) + " " + args, stderr_mode);
}

}  // namespace ptrain::testing
