#include "ptrain/io/output_path.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "ptrain/core/error.h"
#include "ptrain/io/atomic_file.h"

namespace ptrain::io {

namespace fs = std::filesystem;

namespace {

bool present(const fs::path& p) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(p, ec)) || fs::exists(p, ec);
}

// The directory that `missing` (which does not exist) would be created under must be one we may write
// in; every step of the way up to it that exists must be a directory.
void check_creatable(const fs::path& missing, const std::string& path, const std::string& flag) {
  fs::path ancestor = missing.parent_path();
  while (!ancestor.empty() && !present(ancestor) && ancestor != ancestor.parent_path()) ancestor = ancestor.parent_path();
  if (ancestor.empty()) ancestor = ".";
  std::error_code ec;
  check(fs::is_directory(ancestor, ec),
        flag + " " + path + ": cannot be created, " + ancestor.string() + " is a file, not a directory");
  check(::access(ancestor.c_str(), W_OK | X_OK) == 0,
        flag + " " + path + ": cannot be created in " + ancestor.string() + " (" + std::strerror(errno) + ")");
}

}  // namespace

void check_writable_file(const std::string& path, const std::string& flag) {
  check(!path.empty(), flag + ": empty path");
  const fs::path p(through_links(path));  // a link is kept: its target is written (atomic_file.h)
  if (present(p)) {
    std::error_code ec;
    check(!fs::is_directory(p, ec), flag + " " + path + ": is a directory, not a file");
    const fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
    // Written atomically: a temporary file in the same directory is renamed over it.
    check(::access(parent.c_str(), W_OK | X_OK) == 0,
          flag + " " + path + ": cannot be replaced, " + parent.string() + " is not writable (" + std::strerror(errno) + ")");
    return;
  }
  check_creatable(p, path, flag);
}

void check_writable_directory(const std::string& path, const std::string& flag) {
  check(!path.empty(), flag + ": empty path");
  const fs::path p(path);
  if (present(p)) {
    std::error_code ec;
    check(fs::is_directory(p, ec), flag + " " + path + ": is a file, not a directory");
    check(::access(p.c_str(), W_OK | X_OK) == 0,
          flag + " " + path + ": is not writable (" + std::strerror(errno) + ")");
    return;
  }
  check_creatable(p, path, flag);
}

}  // namespace ptrain::io
