#include "ptrain/io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "ptrain/core/error.h"

namespace ptrain::io {

namespace {

std::string errno_text() { return std::strerror(errno); }

std::string directory_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

void write_all(int fd, const std::string& bytes, const std::string& temp_path) {
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot write " + temp_path + ": " + errno_text());
    }
    written += static_cast<size_t>(n);
  }
}

// Without it a crash right after rename can lose the directory entry on some file systems.
void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // Some file systems refuse to open directories; the rename itself is done.
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

std::string through_links(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path target(path);
  std::error_code error;
  // Linux gives up on a path after 40 links (ELOOP); so does this.
  for (int links = 0; fs::is_symlink(fs::symlink_status(target, error)); ++links) {
    check(links < 40, path + ": too many levels of symbolic links");
    const fs::path next = fs::read_symlink(target, error);
    check(!error, path + ": cannot read the symbolic link " + target.string() + ": " + error.message());
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  return target.string();
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  check(!path.empty(), "write_file_atomically: empty path");
  // Errors name the path as given; the file written is a link's target.
  const std::string file = through_links(path);
  std::string temp_path = file + ".tmp.XXXXXX";
  const int fd = ::mkstemp(temp_path.data());
  if (fd < 0) {
    throw Error("cannot write " + path + ": cannot create a temporary file in " + directory_of(file) + ": " +
                errno_text());
  }
  try {
    write_all(fd, bytes, temp_path);
    if (::fsync(fd) != 0) throw Error("cannot write " + path + ": fsync failed: " + errno_text());
    // mkstemp creates 0600; a replaced file keeps its mode, a new one gets the usual 0644 (reading the
    // umask would mean changing it, which races with other threads creating files).
    struct stat existing {};
    ::fchmod(fd, ::stat(file.c_str(), &existing) == 0 ? (existing.st_mode & 07777) : 0644);
    if (::close(fd) != 0) {
      throw Error("cannot write " + path + ": close failed: " + errno_text());
    }
  } catch (...) {
    ::close(fd);
    ::unlink(temp_path.c_str());
    throw;
  }
  if (::rename(temp_path.c_str(), file.c_str()) != 0) {
    const std::string reason = errno_text();
    ::unlink(temp_path.c_str());
    throw Error("cannot write " + path + ": rename failed: " + reason);
  }
  fsync_directory(directory_of(file));
}

void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& writer) {
  // Serialising to memory first keeps the writer away from file descriptors; checkpoints fit in memory
  // anyway since the tensors they hold do.
  std::ostringstream buffer(std::ios::binary);
  try {
    writer(buffer);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error("cannot write " + path + ": " + e.what());
  }
  if (!buffer) throw Error("cannot write " + path + ": the serialiser failed");
  write_file_atomically(path, buffer.str());
}

std::string read_file_bytes(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error("cannot open " + path + ": " + errno_text());
  std::string bytes;
  char chunk[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string reason = errno_text();  // e.g. a directory
      ::close(fd);
      throw Error("cannot read " + path + ": " + reason);
    }
    bytes.append(chunk, static_cast<size_t>(n));
  }
  ::close(fd);
  return bytes;
}

}  // namespace ptrain::io
