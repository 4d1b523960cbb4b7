// Files that are either the old version or the complete new one, never half written: a run killed while
// saving a checkpoint must still be able to resume from the previous checkpoint.
#pragma once

#include <functional>
#include <ostream>
#include <string>

namespace ptrain::io {

// Writes to a temporary file in the target's directory, flushes and fsyncs it, renames it over path and
// fsyncs the directory. On any failure (the writer throwing included) the old file at path is left as it
// was, the temporary is removed and a ptrain::Error naming path is thrown (the writer's own
// ptrain::Error passes through unchanged).
void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& writer);
void write_file_atomically(const std::string& path, const std::string& bytes);

// The whole file; ptrain::Error naming path when it cannot be opened or read.
std::string read_file_bytes(const std::string& path);

}  // namespace ptrain::io
