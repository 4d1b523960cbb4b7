// Checks, before any work starts, that a run will be able to write its outputs, and that none of them
// destroys another: a run that trains for an hour and then cannot write its metrics record or first
// checkpoint has lost the hour, and `--save-weights x.pt --metrics-out x.pt` would leave the record where
// the weights were. Nothing is created (the test that a directory takes new files leaves none behind).
#pragma once

#include <string>
#include <vector>

namespace ptrain::io {

// One path a command writes, and the flag that named it.
struct OutputPath {
  enum class Kind {
    file,        // written atomically, or in place where it is a device, FIFO, socket or stream (atomic_file.h)
    whole_file,  // a regular file only: written by a library that renames a file of its own over it
    directory,   // files are created in it
    owned_directory,  // files are created and removed in it by name (--checkpoint-dir): nothing else may go there
  };
  std::string flag;  // "--metrics-out"
  std::string path;  // empty: the output is off, and not checked
  Kind kind = Kind::file;
};

// Refuses (ptrain::Error naming the flag(s) and path) outputs that cannot be written, or that collide: two
// outputs that are one file (through links, or one directory reached by two paths), a file output inside an
// owned directory, a directory output where a file output is, or two directory outputs of which one is
// owned. Several outputs may share an in-place target (/dev/null, /dev/stdout): nothing is replaced there.
void check_outputs(const std::vector<OutputPath>& outputs);

// Refuses (ptrain::Error naming flag and path) a file path that cannot be written: an existing directory at
// path, a parent that is a file or cannot be created or written in, or an in-place target (a device, FIFO,
// socket, /dev/stdout) that cannot be opened for writing.
void check_writable_file(const std::string& path, const std::string& flag);

// The same for a directory that files will be created in: path itself, when it exists, must be a writable
// directory.
void check_writable_directory(const std::string& path, const std::string& flag);

}  // namespace ptrain::io
