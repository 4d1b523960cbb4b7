#include "ptrain/bench/out_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ptrain/core/error.h"

namespace ptrain::bench {

OutDirectoryLock::OutDirectoryLock(const std::string& directory) {
  const std::string path = directory + "/" + kFileName;
  // Close-on-exec: the runs the bench starts must not inherit the lock and hold the directory after it.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  check(fd_ >= 0, "--out " + directory + ": cannot create " + path + " (" + std::strerror(errno) + ")");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    ::close(fd_);
    fd_ = -1;
    check(error == EWOULDBLOCK, "--out " + directory + ": cannot lock " + path + " (" + std::strerror(error) + ")");
    std::string holder;
    std::getline(std::ifstream(path), holder);
    throw Error("--out " + directory + " is in use by another ptrain bench" +
                (holder.empty() ? std::string() : " (" + holder + ")") +
                ": wait for it to finish, or give this bench another --out");
  }
  std::ostringstream holder;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  holder << "pid " << ::getpid() << " on " << host << "\n";
  const std::string text = holder.str();
  // Only the holder writes the file, so what a refused bench reads is this bench's line (or nothing yet).
  // Without the line the lock holds all the same; a refused bench then names no pid.
  const bool written = ::ftruncate(fd_, 0) == 0 &&
                       ::pwrite(fd_, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size());
  (void)written;
}

OutDirectoryLock::~OutDirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

}  // namespace ptrain::bench
