// Files that are either the old version or the complete new one, never half written: a run killed while
// saving a checkpoint must still be able to resume from the previous checkpoint.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace ptrain::io {

// Where a write to path lands. A regular file (or a path where none is yet) is written atomically: a
// temporary file is renamed over it. Anything else is written in place, opened for appending, never renamed
// over or truncated: a character or block device (/dev/null, /dev/full), a FIFO, a socket, and this process's
// own streams (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N), whatever they are open on: renaming
// over /dev/stdout of `ptrain train > log` would replace the log, and over /dev/null the device.
struct OutputTarget {
  std::string file;       // path, or where its symbolic link(s) lead
  bool in_place = false;  // written where it is (above), never replaced
  int descriptor = -1;    // this process's descriptor N that path names (/dev/stdout: 1), else -1
};

// Throws ptrain::Error naming path for a loop of links.
OutputTarget output_target(const std::string& path);

// The file a write to path reaches: output_target(path).file. An atomic write renames over this file, so
// that a link at path (a --metrics-out kept in a results folder) stays a link and its target gets the new
// contents.
std::string through_links(const std::string& path);

// Opens an in-place target for writing at its end: a duplicate of the process's own descriptor, a
// connection to a socket, or the file opened for appending (a FIFO waits for its reader, as `echo > fifo`
// does). Returns the descriptor, which the caller closes; throws ptrain::Error naming path.
int open_in_place(const OutputTarget& target, const std::string& path);

// Writes to a temporary file in the target's directory (through_links(path)), flushes and fsyncs it, renames it over path and
// fsyncs the directory. On any failure (the writer throwing included) the old file at path is left as it
// was, the temporary is removed and a ptrain::Error naming path is thrown (the writer's own
// ptrain::Error passes through unchanged). An in-place target (output_target) is written where it is
// instead, and a failed write (ENOSPC from /dev/full) is an error naming path and the OS's reason.
void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& writer);
// before_rename, when given, runs once the temporary file is complete and synced, before it replaces path:
// a test seam that holds a write open mid-way (train/checkpointer.h), so that a test can kill the process
// while it is in flight.
void write_file_atomically(const std::string& path, const std::string& bytes,
                           const std::function<void()>& before_rename = {});
// The file as pieces written one after another, as above: a file of gigabytes (a checkpoint) is written from
// the tensors' own memory, never assembled in a buffer of its size first.
void write_file_atomically(const std::string& path, const std::vector<std::string_view>& bytes,
                           const std::function<void()>& before_rename = {});

// The whole file; ptrain::Error naming path when it cannot be opened or read.
std::string read_file_bytes(const std::string& path);

}  // namespace ptrain::io
