#include "ptrain/io/output_path.h"

#include <fcntl.h>
#include <sys/stat.h>
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

// 0 when a new file can be created in dir, else the OS's error number. Tried, not asked of access(): root
// passes access() everywhere but on a read-only file system, and /proc takes no new files from anyone.
int creation_error(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);  // unnamed: nothing is left behind
  if (fd >= 0) {
    ::close(fd);
    return 0;
  }
  const int error = errno;
  if (error != EOPNOTSUPP && error != EISDIR) return error;
  // A file system without unnamed temporary files: a named one, removed at once.
  std::string probe = (dir / ".ptrain-probe.XXXXXX").string();
  const int named = ::mkstemp(probe.data());
  if (named < 0) return errno;
  ::close(named);
  ::unlink(probe.c_str());
  return 0;
}

// The directory that `missing` (which does not exist) would be created under must take new files; every
// step of the way up to it that exists must be a directory.
void check_creatable(const fs::path& missing, const std::string& path, const std::string& flag) {
  fs::path ancestor = missing.parent_path();
  while (!ancestor.empty() && !present(ancestor) && ancestor != ancestor.parent_path()) ancestor = ancestor.parent_path();
  if (ancestor.empty()) ancestor = ".";
  std::error_code ec;
  check(fs::is_directory(ancestor, ec),
        flag + " " + path + ": cannot be created, " + ancestor.string() + " is a file, not a directory");
  const int error = creation_error(ancestor);
  check(error == 0, flag + " " + path + ": cannot be created in " + ancestor.string() + " (" + std::strerror(error) + ")");
}

void check_in_place(const OutputTarget& target, const std::string& path, const std::string& flag) {
  if (target.descriptor >= 0) {
    const int flags = ::fcntl(target.descriptor, F_GETFL);
    const std::string descriptor = "descriptor " + std::to_string(target.descriptor);
    check(flags >= 0, flag + " " + path + ": " + descriptor + " is not open");
    check((flags & O_ACCMODE) != O_RDONLY, flag + " " + path + ": " + descriptor + " is open for reading only");
    return;
  }
  struct stat status {};
  if (::stat(target.file.c_str(), &status) == 0 && S_ISSOCK(status.st_mode)) return;  // connected when written
  if (::access(target.file.c_str(), W_OK) != 0) {
    const int error = errno;
    throw Error(flag + " " + path + ": cannot be opened for writing (" + std::strerror(error) + ")");
  }
}

// What an output is, for comparing it with the others: its nearest existing directory by device and inode
// (one directory reached through links or a bind mount is one) and the rest of its path below that.
std::string identity(const fs::path& where) {
  fs::path existing = where, rest;
  while (!present(existing) && existing.has_parent_path() && existing != existing.parent_path()) {
    rest = rest.empty() ? existing.filename() : existing.filename() / rest;
    existing = existing.parent_path();
  }
  struct stat status {};
  if (::stat(existing.c_str(), &status) != 0) return where.string();
  return std::to_string(status.st_dev) + ":" + std::to_string(status.st_ino) + "/" + rest.string();
}

fs::path canonical_form(const std::string& path) {
  std::error_code ec;
  fs::path where = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) where = fs::absolute(path).lexically_normal();
  if (where.filename().empty() && where.has_parent_path()) where = where.parent_path();  // "dir/"
  return where;
}

bool is_directory_kind(OutputPath::Kind kind) {
  return kind == OutputPath::Kind::directory || kind == OutputPath::Kind::owned_directory;
}

struct Checked {
  const OutputPath* output;
  bool in_place;
  fs::path where;
  std::string key;
};

// Whether `inner` lies inside the directory `outer` (at any depth).
bool inside(const Checked& inner, const Checked& outer) {
  for (fs::path up = inner.where.parent_path(); up.has_relative_path(); up = up.parent_path()) {
    if (identity(up) == outer.key) return true;
  }
  return false;
}

std::string named(const OutputPath& output) { return output.flag + " " + output.path; }

void check_pair(const Checked& a, const Checked& b) {
  if (a.in_place || b.in_place) return;  // nothing is replaced there: a device or stream takes both
  const OutputPath& x = *a.output;
  const OutputPath& y = *b.output;
  const bool x_dir = is_directory_kind(x.kind), y_dir = is_directory_kind(y.kind);
  const bool x_owned = x.kind == OutputPath::Kind::owned_directory, y_owned = y.kind == OutputPath::Kind::owned_directory;
  if (a.key == b.key) {
    if (!x_dir && !y_dir)
      throw Error(named(x) + " and " + named(y) + " are one file: the second written would replace the first");
    if (x_dir != y_dir) throw Error(named(x) + " and " + named(y) + " are one path, used as a file and as a directory");
    if (x_owned || y_owned)
      throw Error(named(x) + " and " + named(y) + " are one directory; " + (x_owned ? x.flag : y.flag) +
                  " must be a directory of its own");
    return;
  }
  for (const auto& [outer, inner] : {std::pair<const Checked*, const Checked*>{&a, &b}, {&b, &a}}) {
    if (outer->output->kind != OutputPath::Kind::owned_directory || !inside(*inner, *outer)) continue;
    throw Error(named(*inner->output) + " lies inside " + named(*outer->output) + ", whose files the run creates and " +
                "removes by name: put it elsewhere");
  }
}

}  // namespace

void check_writable_file(const std::string& path, const std::string& flag) {
  check(!path.empty(), flag + ": empty path");
  const OutputTarget target = output_target(path);  // a link is kept: its target is written (atomic_file.h)
  if (target.in_place) {
    check_in_place(target, path, flag);
    return;
  }
  const fs::path p(target.file);
  if (present(p)) {
    std::error_code ec;
    check(!fs::is_directory(p, ec), flag + " " + path + ": is a directory, not a file");
    const fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
    // Written atomically: a temporary file in the same directory is renamed over it.
    const int error = creation_error(parent);
    check(error == 0, flag + " " + path + ": cannot be replaced, " + parent.string() + " takes no new files (" +
                          std::strerror(error) + ")");
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
    const int error = creation_error(p);
    check(error == 0, flag + " " + path + ": is not writable (" + std::strerror(error) + ")");
    return;
  }
  check_creatable(p, path, flag);
}

void check_outputs(const std::vector<OutputPath>& outputs) {
  std::vector<Checked> checked;
  for (const auto& output : outputs) {
    if (output.path.empty()) continue;
    if (is_directory_kind(output.kind)) {
      check_writable_directory(output.path, output.flag);
      const fs::path where = canonical_form(output.path);
      checked.push_back({&output, false, where, identity(where)});
      continue;
    }
    check_writable_file(output.path, output.flag);
    const OutputTarget target = output_target(output.path);
    check(!target.in_place || output.kind != OutputPath::Kind::whole_file,
          named(output) + ": must be a regular file, not a device, FIFO, socket or stream (it is written whole, "
                          "then renamed into place)");
    const fs::path where = canonical_form(target.file);
    checked.push_back({&output, target.in_place, where, identity(where)});
  }
  for (size_t i = 0; i < checked.size(); ++i)
    for (size_t j = i + 1; j < checked.size(); ++j) check_pair(checked[i], checked[j]);
}

}  // namespace ptrain::io
