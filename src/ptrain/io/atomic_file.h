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

// A file whose head is known only once its body has been read: a header holding a checksum of the data after
// it. The body is cut into chunks (io/chunks.h: chunks_of(body), in that order); each is handed to
// visit_chunk(index, bytes) by the thread about to write it, so that reading the body (a wait until its bytes
// have arrived in host memory, a checksum) and writing it are one pass, not one after the other. A body of
// 256 MiB or more is written by several threads at its offsets. head() runs once every chunk was visited and
// returns the first head_bytes bytes of the file, exactly that many. An in-place target gets every chunk
// visited first, then the head and the body in order. Atomic as above; visit_chunk's or head()'s exception
// passes through, the old file left as it was.
struct BodyThenHead {
  std::vector<std::string_view> body;
  size_t head_bytes = 0;
  std::function<void(size_t index, std::string_view chunk)> visit_chunk;  // may be empty
  std::function<std::string()> head;                                     // may be empty when head_bytes is 0
  // The threads that visit and write the body; 0: by its size, as above. Threads writing one file take turns
  // at its lock in the kernel (one file takes about 3 GB/s, even in memory), so a caller writing several
  // large files at once gives each one thread.
  size_t threads = 0;
};
void write_file_atomically(const std::string& path, const BodyThenHead& file,
                           const std::function<void()>& before_rename = {});

// The whole file; ptrain::Error naming path when it cannot be opened or read.
std::string read_file_bytes(const std::string& path);

}  // namespace ptrain::io
