// `ptrain verify FILE...`: checks checkpoint files as a resume would read them (checksums, metadata, the
// rank files of sharded ones, finite values) without starting a run, and prints for each one where it
// stands and a digest of its weights, so that two checkpoints can be compared.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace ptrain::cli {

// One line per file on out: "FILE: ok, step N ..." or "FILE: error: why". Returns how many failed.
int verify_checkpoints(const std::vector<std::string>& files, std::ostream& out);

}  // namespace ptrain::cli
