// One bench at a time writes an --out directory. Two benches given one --out each wrote the directory's
// workload.yaml and bench.json, and each read the other's workload for its runs: both exited 0 with one
// workload's records. The first bench holds the directory for its life; a second is refused naming the
// directory and the holder. The lock is an flock(2) on a file in the directory, released by the kernel
// when its holder ends however it ends, so a killed bench never leaves the directory locked.
#pragma once

#include <string>

namespace ptrain::bench {

class OutDirectoryLock {
 public:
  // Throws ptrain::Error naming directory (and the pid of the bench holding it) when another holds it.
  explicit OutDirectoryLock(const std::string& directory);
  ~OutDirectoryLock();
  OutDirectoryLock(const OutDirectoryLock&) = delete;
  OutDirectoryLock& operator=(const OutDirectoryLock&) = delete;

  // The file the lock is taken on, inside the directory.
  static constexpr const char* kFileName = ".ptrain-bench.lock";

 private:
  int fd_ = -1;
};

}  // namespace ptrain::bench
