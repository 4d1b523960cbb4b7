// Host memory; the CUDA device's is in memory_cuda.cpp (CUDA builds) or memory_none.cpp (CPU builds).
#include "ptrain/metrics/memory.h"

#include <fstream>

#include "ptrain/core/error.h"

namespace ptrain::metrics {
namespace {

// /proc/self/status has no library reader in Debian's set; its "Key:   1234 kB" lines are simple.
int64_t proc_status_kib(const std::string& key) {
  const std::string path = "/proc/self/status";
  std::ifstream in(path);
  check(in.good(), "cannot read " + path + ": host memory needs Linux's /proc");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size() + 1, key + ":") != 0) continue;
    const auto digits = line.find_first_of("0123456789");
    check(digits != std::string::npos, path + ": no value in line '" + line + "'");
    return std::stoll(line.substr(digits));
  }
  throw Error(path + " has no " + key + " line");
}

}  // namespace

int64_t host_total_bytes() {
  const std::string path = "/proc/meminfo";
  std::ifstream in(path);
  check(in.good(), "cannot read " + path + ": host memory needs Linux's /proc");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemTotal:", 0) != 0) continue;
    const auto digits = line.find_first_of("0123456789");
    check(digits != std::string::npos, path + ": no value in line '" + line + "'");
    return std::stoll(line.substr(digits)) * 1024;
  }
  throw Error(path + " has no MemTotal line");
}

int64_t host_rss_bytes() { return proc_status_kib("VmRSS") * 1024; }
int64_t host_peak_rss_bytes() { return proc_status_kib("VmHWM") * 1024; }

}  // namespace ptrain::metrics
