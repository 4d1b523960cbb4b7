#include "ptrain/io/atomic_file.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

#include "ptrain/core/error.h"
#include "ptrain/io/chunks.h"

namespace ptrain::io {

namespace {

std::string errno_text() { return std::strerror(errno); }

std::string directory_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

void write_all(int fd, std::string_view bytes, const std::string& name) {
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot write " + name + ": " + errno_text());
    }
    written += static_cast<size_t>(n);
  }
}

void pwrite_all(int fd, std::string_view bytes, off_t offset, const std::string& name) {
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::pwrite(fd, bytes.data() + written, bytes.size() - written, offset + static_cast<off_t>(written));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot write " + name + ": " + errno_text());
    }
    written += static_cast<size_t>(n);
  }
}

void write_all(int fd, const std::vector<std::string_view>& pieces, const std::string& name) {
  for (const auto piece : pieces) write_all(fd, piece, name);
}

std::string head_of(const BodyThenHead& file, const std::string& name) {
  if (file.head_bytes == 0) return {};
  std::string head = file.head();
  check(head.size() == file.head_bytes, "cannot write " + name + ": its head came out " + std::to_string(head.size()) +
                                            " bytes long where " + std::to_string(file.head_bytes) + " were laid out");
  return head;
}

// The body's chunks, visited and written at their offsets after the head, then the head at the start, into a
// new regular file (positional writes: no pipe or socket). A body of 256 MiB or more (a checkpoint's tensors)
// goes on several threads (io/chunks.h): their writes take turns at the file's lock, but each one's visit (a
// wait for the bytes to arrive, a checksum) runs beside the others' writes.
void write_body_then_head(int fd, const BodyThenHead& file, const std::string& name) {
  constexpr size_t kParallelFrom = size_t{256} << 20;
  const std::vector<std::string_view> chunks = chunks_of(file.body);
  std::vector<off_t> offsets(chunks.size());
  off_t offset = static_cast<off_t>(file.head_bytes);
  for (size_t i = 0; i < chunks.size(); ++i) {
    offsets[i] = offset;
    offset += static_cast<off_t>(chunks[i].size());
  }
  const size_t body_bytes = static_cast<size_t>(offset) - file.head_bytes;
  // At most 8: they saturate a socket's memory bandwidth, and the training thread that launches the steps
  // beside an --async-checkpoint write needs a core of its own.
  const size_t threads = file.threads > 0          ? file.threads
                         : body_bytes < kParallelFrom ? 1
                                                      : std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
  for_each_index_in_parallel(chunks.size(), threads, [&](size_t i) {
    if (file.visit_chunk) file.visit_chunk(i, chunks[i]);
    pwrite_all(fd, chunks[i], offsets[i], name);
  });
  if (file.head_bytes > 0) pwrite_all(fd, head_of(file, name), 0, name);
  // The descriptor's position where a sequential write would leave it: the end, for whatever comes after.
  if (::lseek(fd, offset, SEEK_SET) < 0) throw Error("cannot write " + name + ": " + errno_text());
}

// Without it a crash right after rename can lose the directory entry on some file systems.
void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // Some file systems refuse to open directories; the rename itself is done.
  ::fsync(fd);
  ::close(fd);
}

namespace fs = std::filesystem;

// N when path names this process's descriptor N: /dev/stdin, /dev/stdout, /dev/stderr, /dev/fd/N,
// /proc/self/fd/N or /proc/<this pid>/fd/N; else -1. Opening such a path reopens what the descriptor is open
// on (the log file of `> log`, from its start) or fails (a socket): writes go through the descriptor itself.
int own_descriptor(const fs::path& absolute) {
  const std::string text = absolute.string();
  if (text == "/dev/stdin") return 0;
  if (text == "/dev/stdout") return 1;
  if (text == "/dev/stderr") return 2;
  for (const std::string& prefix :
       {std::string("/dev/fd/"), std::string("/proc/self/fd/"), "/proc/" + std::to_string(::getpid()) + "/fd/"}) {
    if (text.rfind(prefix, 0) != 0) continue;
    const std::string number = text.substr(prefix.size());
    if (number.empty() || number.size() > 9 || number.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::stoi(number);
  }
  return -1;
}

// The same, for path as written and with its directories' links resolved (a link to /proc/self/fd, as
// /dev/fd is, or to /proc/self, names a descriptor too).
int own_descriptor_of(const fs::path& path) {
  std::error_code error;
  const fs::path absolute = fs::absolute(path, error).lexically_normal();
  if (error) return -1;
  if (const int fd = own_descriptor(absolute); fd >= 0) return fd;
  if (!absolute.has_parent_path() || absolute.filename().empty()) return -1;
  const fs::path parent = fs::weakly_canonical(absolute.parent_path(), error);
  return error ? -1 : own_descriptor(parent / absolute.filename());
}

int connect_to_socket(const std::string& file, const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  check(file.size() < sizeof(address.sun_path), "cannot write " + path + ": the socket's path is too long");
  std::memcpy(address.sun_path, file.c_str(), file.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error("cannot write " + path + ": cannot create a socket: " + errno_text());
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    const std::string reason = errno_text();
    ::close(fd);
    throw Error("cannot write " + path + ": cannot connect to the socket: " + reason);
  }
  return fd;
}

void write_in_place(const OutputTarget& target, const std::string& path, const BodyThenHead& file) {
  const std::vector<std::string_view> chunks = chunks_of(file.body);
  if (file.visit_chunk)
    for (size_t i = 0; i < chunks.size(); ++i) file.visit_chunk(i, chunks[i]);
  const std::string head = head_of(file, path);
  const int fd = open_in_place(target, path);
  try {
    write_all(fd, head, path);
    write_all(fd, file.body, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0 && errno != EINTR) throw Error("cannot write " + path + ": close failed: " + errno_text());
}

}  // namespace

OutputTarget output_target(const std::string& path) {
  OutputTarget out;
  fs::path target(path);
  std::error_code error;
  // Linux gives up on a path after 40 links (ELOOP); so does this.
  for (int links = 0;; ++links) {
    // Checked before following: /dev/stdout and /proc/self/fd/N are links to what the descriptor is open on.
    if (const int fd = own_descriptor_of(target); fd >= 0) return {target.string(), true, fd};
    if (!fs::is_symlink(fs::symlink_status(target, error))) break;
    check(links < 40, path + ": too many levels of symbolic links");
    const fs::path next = fs::read_symlink(target, error);
    check(!error, path + ": cannot read the symbolic link " + target.string() + ": " + error.message());
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  out.file = target.string();
  struct stat status {};
  if (::stat(out.file.c_str(), &status) == 0) {
    // A file of /proc is regular in name only, and cannot be renamed over.
    const fs::path absolute = fs::absolute(target, error).lexically_normal();
    out.in_place = (!S_ISREG(status.st_mode) && !S_ISDIR(status.st_mode)) ||
                   (!S_ISDIR(status.st_mode) && absolute.string().rfind("/proc/", 0) == 0);
  }
  return out;
}

std::string through_links(const std::string& path) { return output_target(path).file; }

int open_in_place(const OutputTarget& target, const std::string& path) {
  if (target.descriptor >= 0) {
    std::fflush(nullptr);  // what this process printed to the stream before goes first
    const int fd = ::fcntl(target.descriptor, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
      throw Error("cannot write " + path + ": descriptor " + std::to_string(target.descriptor) + " is not open (" +
                  errno_text() + ")");
    }
    return fd;
  }
  struct stat status {};
  if (::stat(target.file.c_str(), &status) == 0 && S_ISSOCK(status.st_mode)) return connect_to_socket(target.file, path);
  const int fd = ::open(target.file.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) throw Error("cannot write " + path + ": " + errno_text());
  return fd;
}

void write_file_atomically(const std::string& path, const std::string& bytes,
                           const std::function<void()>& before_rename) {
  write_file_atomically(path, std::vector<std::string_view>{bytes}, before_rename);
}

void write_file_atomically(const std::string& path, const std::vector<std::string_view>& bytes,
                           const std::function<void()>& before_rename) {
  write_file_atomically(path, BodyThenHead{bytes, 0, {}, {}}, before_rename);
}

void write_file_atomically(const std::string& path, const BodyThenHead& bytes,
                           const std::function<void()>& before_rename) {
  check(!path.empty(), "write_file_atomically: empty path");
  const OutputTarget target = output_target(path);
  if (target.in_place) {
    write_in_place(target, path, bytes);
    return;
  }
  // Errors name the path as given; the file written is a link's target.
  const std::string& file = target.file;
  std::string temp_path = file + ".tmp.XXXXXX";
  const int fd = ::mkstemp(temp_path.data());
  if (fd < 0) {
    throw Error("cannot write " + path + ": cannot create a temporary file in " + directory_of(file) + ": " +
                errno_text());
  }
  try {
    write_body_then_head(fd, bytes, temp_path);
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
  if (before_rename) {
    try {
      before_rename();
    } catch (...) {
      ::unlink(temp_path.c_str());
      throw;
    }
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
