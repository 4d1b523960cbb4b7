// Files that are either the old version or the complete new one, never half written: a run killed while
// saving a checkpoint must still be able to resume from the previous checkpoint.
#pragma once

#include <functional>
#include <ostream>
#include <string>

namespace ptrain::io {

// The file a write to path reaches: path itself, or where the symbolic link(s) at path lead. An atomic
// write renames over this file, so that a link at path (a --metrics-out kept in a results folder) stays a
// link and its target gets the new contents. Throws ptrain::Error naming path for a loop of links.
std::string through_links(const std::string& path);

// Writes to a temporary file in the target's directory (through_links(path)), flushes and fsyncs it, renames it over path and
// fsyncs the directory. On any failure (the writer throwing included) the old file at path is left as it
// was, the temporary is removed and a ptrain::Error naming path is thrown (the writer's own
// ptrain::Error passes through unchanged).
void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& writer);
void write_file_atomically(const std::string& path, const std::string& bytes);

// The whole file; ptrain::Error naming path when it cannot be opened or read.
std::string read_file_bytes(const std::string& path);

}  // namespace ptrain::io
