#include "ptrain/bench/runner.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <set>

#include <torch/torch.h>

#include "ptrain/bench/bench_record.h"
#include "ptrain/bench/jobs.h"
#include "ptrain/bench/lanes.h"
#include "ptrain/bench/out_lock.h"
#include "ptrain/bench/preflight.h"
#include "ptrain/bench/process_group.h"
#include "ptrain/core/error.h"

namespace ptrain::bench {

namespace fs = std::filesystem;

namespace {

// Why a run's estimate failed: its error line, the first of the run's log (the estimate runs first), or a
// pointer to the log where it wrote none.
std::string estimate_error(const std::string& log_path) {
  std::ifstream log(log_path);
  std::string line;
  while (std::getline(log, line)) {
    for (const char* mark : {"ptrain: error: ", "ptrain: LibTorch error: "}) {
      const auto at = line.find(mark);
      if (at != std::string::npos) return line.substr(at + std::string(mark).size());
    }
  }
  return "it wrote no error line";
}

// "ptrain fp32-single-x1 (and 16 more): REASON; ..." per distinct reason, in job order.
std::string refusals_text(const std::vector<BenchJob>& jobs, const std::map<size_t, std::string>& refused) {
  std::vector<std::pair<std::string, std::vector<size_t>>> by_reason;
  for (const auto& [i, reason] : refused) {
    auto it = std::find_if(by_reason.begin(), by_reason.end(), [&](const auto& r) { return r.first == reason; });
    if (it == by_reason.end()) it = by_reason.insert(by_reason.end(), {reason, {}});
    it->second.push_back(i);
  }
  std::string text = refused.size() == 1 ? "the run left to run cannot train: "
                                         : "none of the " + std::to_string(refused.size()) +
                                               " runs left to run can train: ";
  for (size_t r = 0; r < by_reason.size(); ++r) {
    const auto& [reason, runs] = by_reason[r];
    const BenchJob& first = jobs[runs.front()];
    text += (r ? "; " : "") + first.framework + " " + first.run.id() +
            (runs.size() > 1 ? " (and " + std::to_string(runs.size() - 1) + " more)" : "") + ": " + reason;
  }
  return text;
}

// A run refused before it started keeps a log all the same, saying why, where its log would be.
void write_refusal_log(const BenchJob& job, const std::string& reason) {
  fs::create_directories(fs::path(job.log_path).parent_path());
  std::ofstream log(job.log_path);
  log << "ptrain bench: not started: " << reason << "\n";
}

// --skip: by run id (every framework's job of it) or framework/id; a name the suite has no job of is an error.
void mark_skipped(std::vector<BenchJob>& jobs, const std::vector<std::string>& names, const Suite& suite) {
  const std::set<std::string> skip(names.begin(), names.end());
  std::set<std::string> unmatched = skip;
  for (auto& job : jobs) {
    for (const std::string& name : {job.run.id(), job.framework + "/" + job.run.id()}) {
      if (skip.count(name) == 0) continue;
      unmatched.erase(name);
      if (job.unavailable.empty()) job.unavailable = "skipped (--skip " + name + ")";
    }
  }
  if (!unmatched.empty()) {
    std::string known;
    std::set<std::string> listed;
    for (const auto& run : suite.runs) {
      if (listed.insert(run.id()).second) known += (known.empty() ? "" : ", ") + run.id();
    }
    throw Error("--skip " + *unmatched.begin() + ": no such run in suite " + suite.name + " (runs: " + known +
                "; prefix ptrain/, pytorch/, pytorch-compiled/ or pytorch-compiled-MODE/ for one framework's)");
  }
}

bool asks_for_compiled(const Suite& suite) {
  return std::any_of(suite.runs.begin(), suite.runs.end(), [](const SuiteRun& run) {
    return std::any_of(run.pytorch.begin(), run.pytorch.end(), is_compiled_variant);
  });
}

}  // namespace

BenchOutcome run_bench(const BenchOptions& o, std::ostream& progress) {
  check(!o.ptrain_executable.empty(), "ptrain bench: the ptrain executable to run is unknown");
  const auto bench_started = std::chrono::steady_clock::now();
  const std::optional<std::chrono::steady_clock::time_point> time_limit =
      o.time_limit_seconds > 0 ? std::optional(bench_started + std::chrono::seconds(o.time_limit_seconds))
                               : std::nullopt;
  int64_t gpus = o.gpus;
  const int64_t visible = torch::cuda::is_available() ? static_cast<int64_t>(torch::cuda::device_count()) : 0;
  if (gpus < 0) gpus = visible;
  check(gpus <= visible, "--gpus " + std::to_string(gpus) + ": only " + std::to_string(visible) + " GPU(s) are visible");
  Suite suite = load_suite(o.suite, o.source_dir, gpus);
  apply_overrides(suite, o.overrides);
  // The reference's Python is asked before anything runs: one lacking a module would otherwise fail each
  // PyTorch run in turn, the first only after ptrain's first run.
  const PytorchAbilities pytorch = o.pytorch ? probe_pytorch(o.python) : PytorchAbilities{};
  if (o.pytorch) {
    check(fs::is_regular_file(o.source_dir + "/bench/pytorch_reference.py"),
          "--pytorch: no bench/pytorch_reference.py under " + o.source_dir);
    check(pytorch.known, "--pytorch: " + pytorch.problem +
                             "; the PyTorch reference needs them: name a Python that has them with --python (Debian: "
                             "apt install python3-torch python3-torchvision, then --python /usr/bin/python3); no run "
                             "started");
  }

  const std::string out = fs::absolute(o.out_dir).lexically_normal().string();
  fs::create_directories(out);
  // Before anything in out is read or written: bench.json and the workload files are this bench's alone.
  const OutDirectoryLock out_lock(out);
  check_same_workload(suite, out + "/bench.json");
  write_workload_files(suite, out);

  std::vector<BenchJob> jobs = plan_jobs(suite, o, out, pytorch);
  mark_skipped(jobs, o.skip, suite);
  // Runs that can start are those not done earlier and possible; the others are reported at once.
  enum class Status { to_run, unavailable, done_earlier, refused };
  std::vector<Status> status(jobs.size(), Status::to_run);
  std::vector<std::optional<metrics::RunRecord>> earlier(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (!jobs[i].unavailable.empty()) {
      status[i] = Status::unavailable;
    } else if ((earlier[i] = finished_record(jobs[i]))) {
      status[i] = Status::done_earlier;
    }
  }
  // Every run's plan before the first starts: an impossible run costs seconds here, not a process each.
  std::map<size_t, std::string> refused;
  Preflight preflight;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (status[i] != Status::to_run) continue;
    std::string why = preflight.refusal(jobs[i]);
    if (why.empty()) continue;
    status[i] = Status::refused;
    refused[i] = std::move(why);
  }
  if (!refused.empty() && std::count(status.begin(), status.end(), Status::to_run) == 0) {
    throw Error("ptrain bench: " + refusals_text(jobs, refused) + "; no run started");
  }
  write_bench_record(suite, o, jobs, out + "/bench.json");

  progress << "ptrain bench: suite " << suite.name << " (" << suite.source << "), " << suite.runs.size() << " runs"
           << (suite.has_several_workloads() ? " of " + std::to_string(suite.workloads.size()) + " workloads" : "")
           << " on " << (suite.on_gpu ? std::to_string(gpus) + " GPU(s)" : std::string("the CPU"))
           << (o.pytorch ? ", each also through PyTorch" : "")
           << (o.side_by_side && suite.on_gpu ? ", runs that need fewer GPUs side by side" : "") << "; results in "
           << out << std::endl;
  if (o.pytorch) {
    progress << "PyTorch for the reference: " << o.python << " with torch " << pytorch.torch_version
             << (pytorch.has_compile ? " (torch.compile)" : " (no torch.compile)") << ", torchvision "
             << pytorch.torchvision_version << ", numpy " << pytorch.numpy_version << "; "
             << o.source_dir + "/bench/pytorch_reference.py" << std::endl;
  }
  BenchOutcome outcome;
  ProgressSink sink(progress);
  std::mutex mutex;  // guards outcome and interrupted
  std::string interrupted;
  std::vector<size_t> to_run;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const BenchJob& job = jobs[i];
    const std::string head = "[" + std::to_string(i + 1) + "/" + std::to_string(jobs.size()) + "] " + job.framework +
                             " " + job.run.label();
    switch (status[i]) {
      case Status::unavailable:
        sink.line(head + ": not run: " + job.unavailable);
        ++outcome.not_available;
        break;
      case Status::done_earlier:
        sink.line(head + ": done earlier, " + summary_of(*earlier[i]));
        ++outcome.done_earlier;
        break;
      case Status::refused: {
        const std::string reason = "cannot train: " + refused[i];
        write_refusal_log(job, reason);
        sink.line(head + ": FAILED before starting (" + reason + "); log: " + job.log_path);
        outcome.failures.push_back(job.framework + " " + job.run.label() + ": " + reason);
        ++outcome.failed;
        break;
      }
      case Status::to_run:
        to_run.push_back(i);
        break;
    }
  }
  const bool lanes = o.side_by_side && suite.on_gpu;
  std::vector<int64_t> needs;
  for (size_t i : to_run) needs.push_back(lanes ? jobs[i].run.devices : 0);
  size_t started_jobs = 0;
  const StopSignals stop_signals;
  run_in_lanes(gpus, needs, [&](size_t n, const std::vector<int64_t>& assigned_gpus) {
    const size_t i = to_run[n];
    const BenchJob& job = jobs[i];
    if (stop_requested()) {
      std::lock_guard<std::mutex> lock(mutex);
      if (interrupted.empty()) interrupted = "the wait for " + job.framework + " " + job.run.label();
      return false;
    }
    if (time_limit && std::chrono::steady_clock::now() > *time_limit) return false;  // counted as left below
    // Alone on the machine, a run sees its first GPUs; in a lane, the ones it was given.
    std::vector<int64_t> visible = assigned_gpus;
    if (!lanes && suite.on_gpu) {
      for (int64_t g = 0; g < job.run.devices; ++g) visible.push_back(g);
    }
    const std::string prefix = lanes ? "      [" + std::to_string(i + 1) + "] " : "      ";
    sink.line("[" + std::to_string(i + 1) + "/" + std::to_string(jobs.size()) + "] " + job.framework + " " +
              job.run.label() + " (" + std::to_string(to_run.size() - n - 1) + " to run after this" +
              (lanes ? ", GPU " + gpu_list(visible) : "") + ")");
    {
      std::lock_guard<std::mutex> lock(mutex);
      ++started_jobs;
    }
    const auto started = std::chrono::steady_clock::now();
    const std::vector<double> load_before = load_average();
    CommandExit exit;
    try {
      fs::create_directories(fs::path(job.metrics_path).parent_path());
      fs::create_directories(fs::path(job.log_path).parent_path());
      exit = run_in_process_group(command_on_gpus(job.command, visible), job.log_path, prefix, sink,
                                  o.run_timeout_seconds, time_limit);
    } catch (const std::exception& e) {
      exit.code = 127;
      exit.last_line = exit.error_line = e.what();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const std::vector<double> load_after = load_average();
    std::lock_guard<std::mutex> lock(mutex);
    const bool timed_out = exit.timed_out;
    if (exit.interrupted) {
      interrupted = job.framework + " " + job.run.label();
      return false;
    }
    if (exit.at_time_limit) {
      sink.line(prefix + "stopped at the --time-limit of " + std::to_string(o.time_limit_seconds) +
                " s; the next bench with the same --out runs it again");
      ++outcome.left_for_later;
      return false;
    }
    if (!job.estimate_path.empty() && !fs::is_regular_file(job.estimate_path)) {
      const std::string why = estimate_error(job.log_path);
      sink.line(prefix + "estimate FAILED (" + why + "): no prediction for this run; log: " + job.log_path);
      outcome.estimate_failures.push_back(job.run.label() + ": " + why);
      ++outcome.estimates_failed;
    }
    if (exit.code == 0) {
      attach_estimate(job);
      attach_bench_context(job, load_before, load_after);
    }
    const auto record = exit.code == 0 ? finished_record(job) : std::nullopt;
    if (record) {
      sink.line(prefix + "done: " + summary_of(*record));
      ++outcome.completed;
    } else {
      const std::string reason =
          timed_out ? "stopped at the --run-timeout of " + std::to_string(o.run_timeout_seconds) + " s; last line: " +
                          exit.last_line
          : exit.code == 0 ? "exited without writing " + job.metrics_path
                           : "exit status " + std::to_string(exit.code) + ": " + exit.error_line;
      sink.line(prefix + "FAILED after " + std::to_string(static_cast<int64_t>(seconds)) + " s (" + reason +
                "); log: " + job.log_path);
      outcome.failures.push_back(job.framework + " " + job.run.label() + ": " + reason);
      ++outcome.failed;
    }
    return true;
  });
  if (!interrupted.empty()) {
    throw Error("ptrain bench interrupted during " + interrupted +
                "; the runs that finished are kept and the next `ptrain bench` with the same --out continues");
  }
  outcome.left_for_later += static_cast<int>(to_run.size() - started_jobs);
  if (outcome.left_for_later > 0) {
    sink.line("ptrain bench: the --time-limit of " + std::to_string(o.time_limit_seconds) + " s is reached; " +
              std::to_string(outcome.left_for_later) +
              " run(s) left for the next `ptrain bench` with the same --out, which continues");
  }
  if (outcome.completed + outcome.done_earlier > 0) {
    outcome.report = report::write_report({out + "/runs"}, out, "ptrain bench: " + suite.name);
  }
  return outcome;
}

}  // namespace ptrain::bench
