#include "ptrain/bench/jobs.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ptrain/core/error.h"
#include "ptrain/metrics/run_record.h"

namespace ptrain::bench {

std::string quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string join_command(const std::vector<std::string>& words) {
  std::string command;
  for (const auto& w : words) command += (command.empty() ? "" : " ") + quoted(w);
  return command;
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  check(fd >= 0, "ptrain bench: cannot open a socket to find a free port");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  ::close(fd);
  check(ok, "ptrain bench: cannot find a free port");
  return ntohs(address.sin_port);
}

std::string pytorch_framework_of(const std::string& variant) {
  const std::string pytorch = metrics::kFrameworkPytorch;
  return variant == kPytorchEager ? pytorch : pytorch + "-" + variant;
}

std::string workload_folder(const std::string& out, const std::string& folder, const SuiteRun& run) {
  return out + "/" + folder + (run.workload.empty() ? "" : "/" + run.workload);
}

std::string workload_file_of(const std::string& out, const SuiteRun& run) {
  return run.workload.empty() ? out + "/workload.yaml" : out + "/workloads/" + run.workload + ".yaml";
}

std::string workload_value(const WorkloadKeys& workload, const std::string& key) {
  for (const auto& [k, v] : workload) {
    if (k == key) return v;
  }
  return "";
}

bool truthy(const std::string& value) { return value == "true" || value == "yes" || value == "on" || value == "1"; }

void set_shape(BenchJob& job) {
  const strategies::StrategySpec spec = job.run.spec();
  job.processes = spec.multi_process() ? job.run.devices : 1;
  job.replicas = spec.drives_several_devices() ? job.run.devices : 1;
}

std::string repeat_suffix(int64_t repeat) { return repeat > 1 ? ".repeat-" + std::to_string(repeat) : ""; }

std::vector<BenchJob> plan_jobs(const Suite& suite, const BenchOptions& o, const std::string& out,
                                const PytorchAbilities& pytorch) {
  check(o.repeat >= 1, "--repeat " + std::to_string(o.repeat) + ": a bench runs each job at least once");
  std::vector<BenchJob> jobs;
  for (const auto& run : suite.runs) {
    // Rounds of the same run one after the other, ptrain's and PyTorch's in turn (A B A B): a pair's two runs
    // meet the machine as alike as it gets, and a load that comes and goes shows in the rounds' spread.
    for (int64_t repeat = 1; repeat <= o.repeat; ++repeat) {
      if (run.ptrain) jobs.push_back(ptrain_job(suite, run, o, out, repeat));
      if (!o.pytorch) continue;
      for (const auto& variant : run.pytorch) jobs.push_back(pytorch_job(suite, run, variant, o, out, pytorch, repeat));
    }
  }
  return jobs;
}

}  // namespace ptrain::bench
