#include "ptrain/bench/runner.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <set>
#include <thread>

#include <torch/torch.h>

#include "ptrain/bench/bench_record.h"
#include "ptrain/bench/duration.h"
#include "ptrain/bench/jobs.h"
#include "ptrain/bench/lanes.h"
#include "ptrain/bench/out_lock.h"
#include "ptrain/bench/preflight.h"
#include "ptrain/bench/command_process.h"
#include "ptrain/core/cuda_runtime.h"
#include "ptrain/core/error.h"
#include "ptrain/core/text.h"
#include "ptrain/data/registry.h"
#include "ptrain/precision/policy.h"
#include "ptrain/train/run_flops.h"

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

// The dtype whose kernels a precision trains with, for the warm-up: pure and mixed fp16 share the CUDA driver's
// compilation of their half kernels, as bf16 and amp-bf16 do (docs/results/2026-12-02-h200-all-modes.md); fp8 and
// tf32 have kernels of their own.
std::string warm_up_dtype(const std::string& precision_name) {
  const auto mode = precision::precision_mode_or_none(precision_name);
  if (!mode) return precision_name;
  if (*mode == precision::PrecisionMode::FP8) return precision::to_string(*mode);
  if (const auto half = precision::half_dtype(*mode)) return precision::dtype_name(*half);
  return precision::to_string(*mode);
}

// "12.3" (digits after the point).
std::string seconds_text(double seconds, int digits) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.*f", digits, seconds);
  return text;
}

// Steps of a warm-up run: ptrain's 3 eager steps (train/step_runner.h), the capture of its CUDA graph and a replay.
constexpr int64_t kWarmUpSteps = 5;

// The suite the warm-up trains: each workload cut to kWarmUpSteps steps on as many batches (and one batch of
// evaluation), without a learning-rate warm-up the run could not hold. Its files go under OUT/warm-up, apart from
// the bench's records and report.
Suite warm_up_suite(const Suite& suite) {
  Suite w = suite;
  const auto cut = [](WorkloadKeys& keys) {
    std::string batch = workload_value(keys, "global-batch-size");
    if (batch.empty()) batch = workload_value(keys, "batch-size");
    if (batch.empty()) batch = std::to_string(config::TrainConfig{}.run.batch_size);
    int64_t samples = 0;
    try {
      samples = std::stoll(batch);
    } catch (const std::exception&) {
      samples = config::TrainConfig{}.run.batch_size;
    }
    std::vector<std::pair<std::string, std::string>> keys_to_set{
        {"epochs", "1"},
        {"max-steps", std::to_string(kWarmUpSteps)},
        {"train-limit", std::to_string(samples * kWarmUpSteps)},
        {"test-limit", std::to_string(samples)},
        {"warmup-epochs", "0"},
        {"warmup-steps", "0"}};
    for (const auto& [key, value] : keys_to_set) {
      auto at = std::find_if(keys.begin(), keys.end(), [&](const auto& kv) { return kv.first == key; });
      if (at == keys.end()) {
        keys.emplace_back(key, value);
      } else {
        at->second = value;
      }
    }
  };
  cut(w.workload);
  for (auto& named : w.workloads) cut(named.second);
  return w;
}

// One untimed job per dtype and framework the jobs to run train (ptrain's; PyTorch eager's where PyTorch runs), on
// one device under strategy single: the JIT compiles kernels, not strategies. A dtype's PyTorch warm-up trains the
// run of its first PyTorch job (ptrain's first run may have none in PyTorch: fp16 + master weights).
std::vector<BenchJob> warm_up_jobs(const Suite& warm_suite, const std::vector<BenchJob>& jobs,
                                   const std::vector<size_t>& to_run, const BenchOptions& o, const std::string& out,
                                   const PytorchAbilities& pytorch, std::vector<std::string>& dtypes) {
  std::vector<BenchJob> warm;
  std::set<std::string> done;
  BenchOptions no_estimate = o;
  no_estimate.estimate = false;
  for (size_t i : to_run) {
    const BenchJob& job = jobs[i];
    const bool is_ptrain = job.framework == metrics::kFrameworkPtrain;
    const std::string dtype = warm_up_dtype(job.run.precision);
    if (!done.insert(dtype + (is_ptrain ? "/ptrain" : "/pytorch")).second) continue;
    if (std::find(dtypes.begin(), dtypes.end(), dtype) == dtypes.end()) dtypes.push_back(dtype);
    SuiteRun run = job.run;
    run.strategy = strategies::StrategySpec().name();
    run.devices = 1;
    warm.push_back(is_ptrain ? ptrain_job(warm_suite, run, no_estimate, out)
                             : pytorch_job(warm_suite, run, kPytorchEager, o, out, pytorch));
    if (!warm.back().unavailable.empty()) {  // eager cannot train what only a compiled variant was asked for
      warm.pop_back();
      done.erase(dtype + "/pytorch");
    }
  }
  return warm;
}

// Seconds a step of the job took in an earlier record under OUT/runs: the same job's, else the same framework's at
// the same precision (the workload is the bench's own: check_same_workload refuses an --out of another).
std::optional<double> recorded_step_seconds(const std::vector<report::ReportRun>& records, const BenchJob& job) {
  const auto step_of = [](const metrics::RunRecord& r) { return r.steady_step_median_seconds; };
  for (const auto& run : records) {
    if (run.name == job.framework + "/" + job.run.id() && step_of(run.record)) return step_of(run.record);
  }
  for (const auto& run : records) {
    const bool same_framework = run.name.rfind(job.framework + "/", 0) == 0 &&
                                run.name.find('/', job.framework.size() + 1) == std::string::npos;
    if (same_framework && run.record.precision.rfind(job.run.precision, 0) == 0 &&
        run.record.devices == job.run.devices && step_of(run.record)) {
      return step_of(run.record);
    }
  }
  return std::nullopt;
}

// What the bench expects to take, for its log's first lines: the jobs to run and the warm-up before them.
std::string expected_duration_text(const Suite& suite, const std::vector<BenchJob>& jobs,
                                   const std::vector<size_t>& to_run, const std::vector<BenchJob>& warm,
                                   Preflight& preflight, const std::string& out) {
  std::vector<report::ReportRun> records;
  if (fs::is_directory(out + "/runs")) {
    try {
      records = report::read_runs({out + "/runs"});
    } catch (const std::exception&) {
      // no record to go by: the estimate falls back on FLOPs
    }
  }
  std::string device_name, peak_basis;
  if (suite.on_gpu) {
    try {
      device_name = cuda_runtime::device_properties(0).name;
    } catch (const std::exception&) {
      device_name = "GPU";
    }
  }
  // The job's config, read once for what the estimate asks of it; none where it cannot be read (the run's own
  // error comes later).
  const auto config_of = [](const BenchJob& job) -> std::optional<config::TrainConfig> {
    try {
      return train_config_of(job.train_arguments, job.processes);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  };
  const auto searches_fp32_convolutions = [&](const BenchJob& job, const std::optional<config::TrainConfig>& c) {
    return suite.on_gpu && precision::mode_named(job.run.precision) == precision::PrecisionMode::FP32 && c &&
           c->run.cudnn_benchmark && !data::is_token_dataset(c->data.dataset);
  };
  std::vector<JobDuration> durations;
  std::set<std::string> jit_dtypes;
  for (size_t i : to_run) {
    const BenchJob& job = jobs[i];
    const auto c = config_of(job);
    JobDuration d;
    d.pytorch = job.framework != metrics::kFrameworkPtrain;
    d.compiled = !job.compile_mode.empty();
    d.estimate = !job.estimate_path.empty();
    d.multi_process = job.run.spec().multi_process();
    d.fp32_convolution_search = searches_fp32_convolutions(job, c);
    estimate::RunLength length;
    preflight.refusal(job, &length);
    d.steps = length.total_steps;
    if ((d.step_seconds = recorded_step_seconds(records, job))) {
      d.measured = true;
    } else if (c) {
      try {
        const auto forward = forward_flops_per_sample(*c);
        const auto mode = precision::mode_named(job.run.precision);
        if (forward && suite.on_gpu) {
          const auto peak = metrics::dense_peak(cuda_runtime::device_properties(0), train::math_rate_of(mode));
          if (peak) {
            d.step_seconds = step_seconds_from_flops(*forward, c->run.batch_size, peak->flops_per_second,
                                                     assumed_mfu(train::math_rate_of(mode)));
            peak_basis = peak->basis;
          }
        } else if (forward) {
          d.step_seconds = step_seconds_from_flops(*forward, c->run.batch_size, kCpuFlopsPerSecond, 1.0);
        }
      } catch (const std::exception&) {
        // unknown: counted as such in the line
      }
    }
    if (suite.on_gpu) jit_dtypes.insert(warm_up_dtype(job.run.precision));
    durations.push_back(d);
  }
  std::vector<JobDuration> warm_durations;
  for (const auto& job : warm) {
    JobDuration d;
    d.pytorch = job.framework != metrics::kFrameworkPtrain;
    d.fp32_convolution_search = searches_fp32_convolutions(job, config_of(job));
    warm_durations.push_back(d);
  }
  const DurationEstimate e = expected_duration(durations, static_cast<int64_t>(jit_dtypes.size()), warm_durations);
  return duration_line(e, suite.on_gpu ? gpu_flops_basis(device_name, peak_basis) : cpu_flops_basis());
}

// The suite's workloads that turn cuDNN's search off (cudnn-benchmark: false), for the report's note: "the
// workload", or their names in a suite of several; "" where none does.
std::string heuristic_workloads(const Suite& suite) {
  const auto heuristic = [](const WorkloadKeys& w) {
    const std::string value = workload_value(w, "cudnn-benchmark");
    return !value.empty() && !truthy(value);
  };
  if (!suite.has_several_workloads()) return heuristic(suite.workload) ? "the workload" : "";
  std::vector<std::string> names;
  for (const auto& [name, keys] : suite.workloads) {
    if (heuristic(keys)) names.push_back(name);
  }
  return join(names, ", ");
}

using Clock = std::chrono::steady_clock;

// The GPUs the bench spreads its runs over: --gpus, or every visible one (0: the CPU).
int64_t bench_gpus(const BenchOptions& o) {
  const int64_t visible = torch::cuda::is_available() ? static_cast<int64_t>(torch::cuda::device_count()) : 0;
  const int64_t gpus = o.gpus < 0 ? visible : o.gpus;
  check(gpus <= visible, "--gpus " + std::to_string(gpus) + ": only " + std::to_string(visible) + " GPU(s) are visible");
  return gpus;
}

// What the reference's Python can do, asked before anything runs: one lacking a module would otherwise fail each
// PyTorch run in turn, the first only after ptrain's first run.
PytorchAbilities checked_pytorch(const BenchOptions& o) {
  if (!o.pytorch) return {};
  const PytorchAbilities pytorch = probe_pytorch(o.python);
  check(fs::is_regular_file(o.source_dir + "/bench/pytorch_reference.py"),
        "--pytorch: no bench/pytorch_reference.py under " + o.source_dir);
  check(pytorch.known, "--pytorch: " + pytorch.problem +
                           "; the PyTorch reference needs them: name a Python that has them with --python (Debian: "
                           "apt install python3-torch python3-torchvision, then --python /usr/bin/python3); no run "
                           "started");
  return pytorch;
}

enum class JobStatus { to_run, unavailable, done_earlier, refused };

// Where each job stands before the first one starts.
struct JobTriage {
  std::vector<JobStatus> status;
  std::vector<std::optional<metrics::RunRecord>> earlier;  // the records of the jobs done earlier
  std::map<size_t, std::string> refused;                   // why each refused job cannot train

  std::vector<size_t> with(JobStatus wanted) const {
    std::vector<size_t> indices;
    for (size_t i = 0; i < status.size(); ++i) {
      if (status[i] == wanted) indices.push_back(i);
    }
    return indices;
  }
};

// Runs that can start are those not done earlier and possible. Every run's plan is made before the first starts:
// an impossible run costs seconds here, not a process each. Throws when no run left to run can train.
JobTriage triage_jobs(const std::vector<BenchJob>& jobs, Preflight& preflight) {
  JobTriage triage{std::vector<JobStatus>(jobs.size(), JobStatus::to_run),
                   std::vector<std::optional<metrics::RunRecord>>(jobs.size()), {}};
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (!jobs[i].unavailable.empty()) {
      triage.status[i] = JobStatus::unavailable;
    } else if ((triage.earlier[i] = finished_record(jobs[i]))) {
      triage.status[i] = JobStatus::done_earlier;
    }
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (triage.status[i] != JobStatus::to_run) continue;
    std::string why = preflight.refusal(jobs[i]);
    if (why.empty()) continue;
    triage.status[i] = JobStatus::refused;
    triage.refused[i] = std::move(why);
  }
  if (!triage.refused.empty() && triage.with(JobStatus::to_run).empty()) {
    throw Error("ptrain bench: " + refusals_text(jobs, triage.refused) + "; no run started");
  }
  return triage;
}

void announce_bench(std::ostream& progress, const Suite& suite, const BenchOptions& o, int64_t gpus,
                    const std::string& out, const PytorchAbilities& pytorch) {
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
}

// Says of each job that will not run why, and counts it in outcome; returns the jobs to run, in order.
std::vector<size_t> report_jobs_not_run(const std::vector<BenchJob>& jobs, const JobTriage& triage, ProgressSink& sink,
                                        BenchOutcome& outcome) {
  std::vector<size_t> to_run;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const BenchJob& job = jobs[i];
    const std::string head = "[" + std::to_string(i + 1) + "/" + std::to_string(jobs.size()) + "] " + job.framework +
                             " " + job.run.label();
    switch (triage.status[i]) {
      case JobStatus::unavailable:
        sink.line(head + ": not run: " + job.unavailable);
        ++outcome.not_available;
        break;
      case JobStatus::done_earlier:
        sink.line(head + ": done earlier, " + summary_of(*triage.earlier[i]));
        ++outcome.done_earlier;
        break;
      case JobStatus::refused: {
        const std::string reason = "cannot train: " + triage.refused.at(i);
        write_refusal_log(job, reason);
        sink.line(head + ": FAILED before starting (" + reason + "); log: " + job.log_path);
        outcome.failures.push_back(job.framework + " " + job.run.label() + ": " + reason);
        ++outcome.failed;
        break;
      }
      case JobStatus::to_run:
        to_run.push_back(i);
        break;
    }
  }
  return to_run;
}

// The untimed runs before the timed ones (none where the suite asks for no warm-up), under out/warm-up.
struct WarmUp {
  Suite suite;
  std::string out;
  std::vector<std::string> dtypes;
  std::vector<BenchJob> jobs;
};

WarmUp plan_warm_up(const Suite& suite, const std::vector<BenchJob>& jobs, const std::vector<size_t>& runnable,
                    const BenchOptions& o, const std::string& out, const PytorchAbilities& pytorch) {
  WarmUp warm{suite.warm_up ? warm_up_suite(suite) : suite, out + "/warm-up", {}, {}};
  if (suite.warm_up) warm.jobs = warm_up_jobs(warm.suite, jobs, runnable, o, warm.out, pytorch, warm.dtypes);
  return warm;
}

// Runs the warm-up's jobs, one framework's side by side (each dtype's JIT is single-threaded host work, and three
// ResNet-50 runs at batch 128 take under 50 GB of an 80 GB GPU), ptrain's first: PyTorch's start alone takes 13 s.
// Returns the report's note on what it ran; throws when interrupted.
std::string run_warm_up(const WarmUp& warm, bool on_gpu, const BenchOptions& o,
                        const std::optional<Clock::time_point>& time_limit, ProgressSink& sink) {
  write_workload_files(warm.suite, warm.out);
  sink.line("warm-up: " + std::to_string(warm.jobs.size()) + " untimed run(s) of " + std::to_string(kWarmUpSteps) +
            " steps, one per dtype (" + join(warm.dtypes, ", ") +
            ") and framework, so that the CUDA driver compiles each dtype's kernels before the clocks start");
  const auto warm_started = Clock::now();
  std::vector<std::string> parts(warm.jobs.size());
  std::vector<CommandExit> exits(warm.jobs.size());
  for (const std::string& framework : {std::string(metrics::kFrameworkPtrain), std::string()}) {
    std::vector<std::thread> threads;
    for (size_t w = 0; w < warm.jobs.size(); ++w) {
      const BenchJob& job = warm.jobs[w];
      if ((job.framework == metrics::kFrameworkPtrain) != !framework.empty()) continue;
      threads.emplace_back([&, w] {
        const auto started = Clock::now();
        CommandExit& exit = exits[w];
        try {
          fs::create_directories(fs::path(job.metrics_path).parent_path());
          fs::create_directories(fs::path(job.log_path).parent_path());
          exit = run_in_process_group(
              command_on_gpus(job.command, on_gpu ? std::vector<int64_t>{0} : std::vector<int64_t>{}), job.log_path,
              "      ", sink, o.run_timeout_seconds, time_limit);
        } catch (const std::exception& e) {
          exit.code = 127;
          exit.error_line = e.what();
        }
        const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
        // A failed warm-up costs the timed runs nothing but the JIT it did not pay: said, and the bench goes on.
        parts[w] = job.framework + " " + warm_up_dtype(job.run.precision) + " " + seconds_text(seconds, 1) + " s" +
                   (exit.code == 0 ? std::string()
                                   : " (FAILED: " + (exit.timed_out ? std::string("run timeout") : exit.error_line) +
                                         "; log: " + job.log_path + ")");
        sink.line("warm-up: " + parts[w]);
      });
    }
    for (auto& thread : threads) thread.join();
    for (size_t w = 0; w < warm.jobs.size(); ++w) {
      if (exits[w].interrupted) {
        throw Error("ptrain bench interrupted during the warm-up (" + warm.jobs[w].framework + " " +
                    warm.jobs[w].run.precision + "); no timed run started");
      }
    }
  }
  const double warm_seconds = std::chrono::duration<double>(Clock::now() - warm_started).count();
  sink.line("warm-up: " + seconds_text(warm_seconds, 0) + " s, before the first timed run");
  const bool pytorch_warmed = std::any_of(warm.jobs.begin(), warm.jobs.end(), [](const BenchJob& job) {
    return job.framework != metrics::kFrameworkPtrain;
  });
  return "Warm-up: before the clocks started, the bench trained " + std::to_string(kWarmUpSteps) +
         " untimed steps per dtype (" + join(warm.dtypes, ", ") + ") in ptrain" +
         (pytorch_warmed ? " and in PyTorch eager, " : ", ") + seconds_text(warm_seconds, 0) + " s in all (" +
         join(parts, "; ") +
         "), so that the CUDA driver's first compilation of LibTorch's and cuDNN's PTX kernels for a dtype "
         "fell on no timed run.";
}

// The timed runs, which lanes may run side by side: each job's start, its process and what its end adds to the
// outcome. run is the lanes' task.
struct TimedRuns {
  const std::vector<BenchJob>& jobs;
  const std::vector<size_t>& to_run;
  const BenchOptions& o;
  bool on_gpu;
  bool lanes;
  std::optional<Clock::time_point> time_limit;
  ProgressSink& sink;
  BenchOutcome& outcome;
  std::mutex mutex;         // guards outcome, interrupted and started
  std::string interrupted;  // the job during which the bench was asked to stop; empty: it was not
  size_t started = 0;

  bool run(size_t n, const std::vector<int64_t>& assigned_gpus);
  // What the ended job adds to the outcome; false where the bench stops after it.
  bool record_end(size_t i, const CommandExit& exit, double seconds, const std::vector<double>& load_before,
                  const std::vector<double>& load_after, const std::string& prefix);
};

bool TimedRuns::run(size_t n, const std::vector<int64_t>& assigned_gpus) {
  const size_t i = to_run[n];
  const BenchJob& job = jobs[i];
  if (stop_requested()) {
    std::lock_guard<std::mutex> lock(mutex);
    if (interrupted.empty()) interrupted = "the wait for " + job.framework + " " + job.run.label();
    return false;
  }
  if (time_limit && Clock::now() > *time_limit) return false;  // counted as left by the caller
  // Alone on the machine, a run sees its first GPUs; in a lane, the ones it was given.
  std::vector<int64_t> visible = assigned_gpus;
  if (!lanes && on_gpu) {
    for (int64_t g = 0; g < job.run.devices; ++g) visible.push_back(g);
  }
  const std::string prefix = lanes ? "      [" + std::to_string(i + 1) + "] " : "      ";
  sink.line("[" + std::to_string(i + 1) + "/" + std::to_string(jobs.size()) + "] " + job.framework + " " +
            job.run.label() + " (" + std::to_string(to_run.size() - n - 1) + " to run after this" +
            (lanes ? ", GPU " + gpu_list(visible) : "") + ")");
  {
    std::lock_guard<std::mutex> lock(mutex);
    ++started;
  }
  const auto job_started = Clock::now();
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
  const double seconds = std::chrono::duration<double>(Clock::now() - job_started).count();
  const std::vector<double> load_after = load_average();
  std::lock_guard<std::mutex> lock(mutex);
  return record_end(i, exit, seconds, load_before, load_after, prefix);
}

bool TimedRuns::record_end(size_t i, const CommandExit& exit, double seconds, const std::vector<double>& load_before,
                           const std::vector<double>& load_after, const std::string& prefix) {
  const BenchJob& job = jobs[i];
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
    return true;
  }
  const std::string reason =
      exit.timed_out ? "stopped at the --run-timeout of " + std::to_string(o.run_timeout_seconds) + " s; last line: " +
                           exit.last_line
      : exit.code == 0 ? "exited without writing " + job.metrics_path
                       : "exit status " + std::to_string(exit.code) + ": " + exit.error_line;
  sink.line(prefix + "FAILED after " + std::to_string(static_cast<int64_t>(seconds)) + " s (" + reason +
            "); log: " + job.log_path);
  outcome.failures.push_back(job.framework + " " + job.run.label() + ": " + reason);
  ++outcome.failed;
  return true;
}

}  // namespace

BenchOutcome run_bench(const BenchOptions& o, std::ostream& progress) {
  check(!o.ptrain_executable.empty(), "ptrain bench: the ptrain executable to run is unknown");
  const std::optional<Clock::time_point> time_limit =
      o.time_limit_seconds > 0 ? std::optional(Clock::now() + std::chrono::seconds(o.time_limit_seconds)) : std::nullopt;
  const int64_t gpus = bench_gpus(o);
  Suite suite = load_suite(o.suite, o.source_dir, gpus);
  apply_overrides(suite, o.overrides);
  const PytorchAbilities pytorch = checked_pytorch(o);

  const std::string out = fs::absolute(o.out_dir).lexically_normal().string();
  fs::create_directories(out);
  // Before anything in out is read or written: bench.json and the workload files are this bench's alone.
  const OutDirectoryLock out_lock(out);
  check_same_workload(suite, out + "/bench.json");
  write_workload_files(suite, out);

  std::vector<BenchJob> jobs = plan_jobs(suite, o, out, pytorch);
  mark_skipped(jobs, o.skip, suite);
  Preflight preflight;
  const JobTriage triage = triage_jobs(jobs, preflight);
  write_bench_record(suite, o, jobs, out + "/bench.json");

  announce_bench(progress, suite, o, gpus, out, pytorch);
  // Before anything runs: the warm-up jobs, and how long the bench will take.
  const WarmUp warm = plan_warm_up(suite, jobs, triage.with(JobStatus::to_run), o, out, pytorch);
  progress << "ptrain bench: "
           << expected_duration_text(suite, jobs, triage.with(JobStatus::to_run), warm.jobs, preflight, out)
           << std::endl;
  std::vector<std::string> notes;
  if (!suite.accuracy) {
    notes.push_back("Accuracy is left out: suite " + suite.name +
                    " trains short runs for throughput, memory and utilisation, evaluating on a handful of test "
                    "samples, so the test accuracy figures below mean nothing. For accuracy, train the runs at full "
                    "length: the standard suite (ptrain bench --suite standard) trains each for 5 epochs.");
    progress << "ptrain bench: " << notes.back() << std::endl;
  }
  if (const std::string heuristic = heuristic_workloads(suite); suite.on_gpu && !heuristic.empty()) {
    notes.push_back("cuDNN's heuristics choose the convolution algorithms of " + heuristic +
                    " in both frameworks (cudnn-benchmark: false), without the search that times them all (about "
                    "30 s of each fp32 ResNet-50 run): the convolutions may run slower than a searched run's.");
    progress << "ptrain bench: " << notes.back() << std::endl;
  }
  BenchOutcome outcome;
  ProgressSink sink(progress);
  const std::vector<size_t> to_run = report_jobs_not_run(jobs, triage, sink, outcome);
  const InterruptRelay interrupt_relay;
  if (!warm.jobs.empty()) notes.push_back(run_warm_up(warm, suite.on_gpu, o, time_limit, sink));

  const bool lanes = o.side_by_side && suite.on_gpu;
  TimedRuns timed{jobs, to_run, o, suite.on_gpu, lanes, time_limit, sink, outcome, {}, {}, 0};
  std::vector<int64_t> needs;
  for (size_t i : to_run) needs.push_back(lanes ? jobs[i].run.devices : 0);
  run_in_lanes(gpus, needs, [&](size_t n, const std::vector<int64_t>& assigned) { return timed.run(n, assigned); });
  if (!timed.interrupted.empty()) {
    throw Error("ptrain bench interrupted during " + timed.interrupted +
                "; the runs that finished are kept and the next `ptrain bench` with the same --out continues");
  }
  outcome.left_for_later += static_cast<int>(to_run.size() - timed.started);
  if (outcome.left_for_later > 0) {
    sink.line("ptrain bench: the --time-limit of " + std::to_string(o.time_limit_seconds) + " s is reached; " +
              std::to_string(outcome.left_for_later) +
              " run(s) left for the next `ptrain bench` with the same --out, which continues");
  }
  if (outcome.completed + outcome.done_earlier > 0) {
    outcome.report = report::write_report({out + "/runs"}, out, "ptrain bench: " + suite.name, notes);
  }
  return outcome;
}

}  // namespace ptrain::bench
