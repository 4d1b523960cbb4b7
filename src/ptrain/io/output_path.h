// Checks, before any work starts, that a run will be able to write its outputs: a run that trains for an
// hour and then cannot write its metrics record or first checkpoint has lost the hour. Nothing is created.
#pragma once

#include <string>

namespace ptrain::io {

// Refuses (ptrain::Error naming flag and path) a file path that cannot be written: an existing directory or
// read-only file at path, or a parent that is a file or cannot be created or written in.
void check_writable_file(const std::string& path, const std::string& flag);

// The same for a directory that files will be created in: path itself, when it exists, must be a writable
// directory.
void check_writable_directory(const std::string& path, const std::string& flag);

}  // namespace ptrain::io
