#include "ptrain/bench/runner.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <set>
#include <sstream>
#include <mutex>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "ptrain/bench/lanes.h"
#include "ptrain/bench/preflight.h"
#include "ptrain/bench/run_log.h"
#include "ptrain/bench/suite.h"
#include "ptrain/config/cli_options.h"
#include "ptrain/config/train_config.h"
#include "ptrain/core/error.h"
#include "ptrain/metrics/environment.h"
#include "ptrain/metrics/run_record.h"
#include "ptrain/models/zoo.h"
#include "ptrain/models/torchscript_model.h"

namespace ptrain::bench {

namespace fs = std::filesystem;

namespace {

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

// A port nobody listens on now, for a run's rendezvous: benches (and tests) running side by side must
// not meet on a fixed default port.
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

constexpr const char* kFsdpMinNumParams = "1000000";

// Strategies that start a process per device (through ptrain launch or torchrun).
bool one_process_per_device(const std::string& strategy) {
  return strategy == "ddp" || strategy == "zero1" || strategy == "zero2" || strategy == "zero3" || strategy == "fsdp";
}

using Job = BenchJob;

constexpr const char* kFrameworkPytorchCompiled = "pytorch-compiled";

// A job's files: its record under runs/<framework>/ by id (which holds the workload in a suite of several),
// its log and estimate in a folder per workload.
std::string workload_folder(const std::string& out, const std::string& folder, const SuiteRun& run) {
  return out + "/" + folder + (run.workload.empty() ? "" : "/" + run.workload);
}

// The `ptrain train --config` file of the run's workload.
std::string workload_file_of(const std::string& out, const SuiteRun& run) {
  return run.workload.empty() ? out + "/workload.yaml" : out + "/workloads/" + run.workload + ".yaml";
}

void write_workload_file(const Suite& suite, const std::string& name, const WorkloadKeys& workload,
                         const std::string& path) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path);
  out << "# The workload " << (name.empty() ? "" : "'" + name + "' ") << "of suite '" << suite.name << "' ("
      << suite.source << "), as ptrain bench ran it.\n";
  for (const auto& [key, value] : workload) {
    out << key << ": " << (value.find(',') != std::string::npos ? "[" + value + "]" : value) << "\n";
  }
  check(out.good(), "cannot write " + path);
}

std::string workload_value(const WorkloadKeys& workload, const std::string& key) {
  for (const auto& [k, v] : workload) {
    if (k == key) return v;
  }
  return "";
}

bool truthy(const std::string& value) { return value == "true" || value == "yes" || value == "on" || value == "1"; }

// The arguments of the run's `ptrain train`, after the executable and "train".
std::vector<std::string> ptrain_train_arguments(const Suite& suite, const SuiteRun& run, const std::string& out,
                                                const std::string& metrics_path) {
  std::vector<std::string> train{"--config", workload_file_of(out, run), "--precision", run.precision,
                                 "--strategy", run.strategy, "--progress", "lines", "--metrics-out", metrics_path};
  if (run.master_weights) train.push_back("--master-weights");
  // FSDP's units as the PyTorch reference wraps its model (size-based, at least this many parameters), so
  // that both sides shard the same units.
  if (run.strategy == "fsdp") train.insert(train.end(), {"--min-num-params", kFsdpMinNumParams});
  const bool gpu = suite.on_gpu;
  if (run.strategy == "dp") {
    train.insert(train.end(), {"--device", gpu ? "cuda:0" : "cpu", "--replicas", std::to_string(run.devices)});
  } else if (one_process_per_device(run.strategy)) {
    train.insert(train.end(), {"--device", gpu ? "cuda" : "cpu"});
    if (!gpu) {
      // Processes sharing the cores: each takes its share instead of all of them.
      const auto cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
      train.insert(train.end(), {"--threads", std::to_string(std::max<int64_t>(1, cores / run.devices))});
    }
  } else {
    train.insert(train.end(), {"--device", gpu ? "cuda:0" : "cpu"});
  }
  return train;
}

// How the run spreads over its devices: processes, and devices per process.
void set_shape(Job& job) {
  job.processes = one_process_per_device(job.run.strategy) ? job.run.devices : 1;
  job.replicas = job.run.strategy == "dp" ? job.run.devices : 1;
}

Job ptrain_job(const Suite& suite, const SuiteRun& run, const BenchOptions& o, const std::string& out) {
  Job job{metrics::kFrameworkPtrain, run};
  const std::string workload_file = workload_file_of(out, run);
  job.metrics_path = out + "/runs/ptrain/" + run.id() + ".json";
  job.log_path = workload_folder(out, "logs", run) + "/ptrain-" + run.run_id() + ".log";
  job.train_arguments = ptrain_train_arguments(suite, run, out, job.metrics_path);
  set_shape(job);
  const bool gpu = suite.on_gpu;
  std::vector<std::string> train{o.ptrain_executable, "train"};
  train.insert(train.end(), job.train_arguments.begin(), job.train_arguments.end());
  if (one_process_per_device(run.strategy)) {
    std::vector<std::string> launch{o.ptrain_executable, "launch", "--nproc-per-node", std::to_string(run.devices),
                                    "--master-port", std::to_string(free_port()), "--"};
    train.insert(train.begin(), launch.begin(), launch.end());
  }
  job.command = join_command(train);
  if (o.estimate) {
    job.estimate_path = workload_folder(out, "estimates", run) + "/" + run.run_id() + ".json";
    std::vector<std::string> estimate{o.ptrain_executable, "estimate", "--config", workload_file, "--precision",
                                      run.precision, "--strategy", run.strategy, "--device", gpu ? "cuda:0" : "cpu",
                                      "--devices", std::to_string(run.devices), "--json", job.estimate_path};
    if (run.master_weights) estimate.push_back("--master-weights");
    // A failed estimate leaves the run without a prediction, not without its measurement.
    job.command = join_command({"mkdir", "-p", workload_folder(out, "estimates", run)}) + " && " +
                  join_command({"rm", "-f", job.estimate_path}) + "; " + join_command(estimate) + "; " + job.command;
  }
  return job;
}

// Puts the prediction `ptrain estimate` made for the run's strategy into the run's record (extra.estimate),
// where the report finds it. A missing or unreadable estimate leaves the record as it is.
void attach_estimate(const Job& job) {
  if (job.estimate_path.empty() || !fs::is_regular_file(job.estimate_path)) return;
  try {
    std::ifstream in(job.estimate_path);
    const auto estimate = nlohmann::json::parse(in);
    std::ifstream record_in(job.metrics_path);
    metrics::RunRecord record = metrics::run_record_from_json(nlohmann::json::parse(record_in));
    for (const auto& row : estimate.at("strategies")) {
      if (row.at("strategy") != job.run.strategy) continue;
      record.extra["estimate"] = {{"strategy", row.at("strategy")},
                                  {"devices", row.at("devices")},
                                  {"predicted_peak_allocated_bytes", row.at("predicted_peak_allocated_bytes")},
                                  {"bytes_per_sample", estimate.at("bytes_per_sample")},
                                  {"fixed_bytes", estimate.at("fixed_bytes")},
                                  {"probes", estimate.at("probes")}};
      metrics::write_run_record(job.metrics_path, record);
      return;
    }
  } catch (const std::exception&) {
    // The prediction is an addition: a run's own record stands without it.
  }
}

// The workload keys bench/pytorch_reference.py understands, its flag for each, and ptrain's default,
// passed when the workload leaves the key out: the script's own defaults are the standard workload's, and
// both sides must train the same job.
struct PytorchFlag {
  std::string flag, ptrain_default;
};
const std::map<std::string, PytorchFlag>& pytorch_flags() {
  static const std::map<std::string, PytorchFlag> flags = [] {
    const config::TrainConfig d;
    const auto text = [](double v) {
      std::ostringstream out;
      out << v;
      return out.str();
    };
    const auto number = [](int64_t v) { return std::to_string(v); };
    return std::map<std::string, PytorchFlag>{
        {"model", {"--model", d.model.name}},
        {"weights", {"--weights", d.model.weights}},
        {"gpt-layers", {"--gpt-layers", number(d.model.gpt_layers)}},
        {"gpt-width", {"--gpt-width", number(d.model.gpt_width)}},
        {"gpt-heads", {"--gpt-heads", number(d.model.gpt_heads)}},
        {"vocab-size", {"--vocab-size", number(d.model.vocab_size)}},
        {"dataset", {"--dataset", d.data.dataset}},
        {"data-path", {"--data", d.data.path}},
        {"image-size", {"--image-size", number(d.data.image_size)}},
        {"seq-len", {"--seq-len", number(d.data.seq_len)}},
        {"train-limit", {"--train-limit", number(d.data.train_limit)}},
        {"test-limit", {"--test-limit", number(d.data.test_limit)}},
        {"batch-size", {"--batch-size", number(d.run.batch_size)}},
        {"eval-batch-size", {"--eval-batch-size", number(d.run.eval_batch_size)}},
        {"epochs", {"--epochs", number(d.run.epochs)}},
        {"max-steps", {"--max-steps", number(d.run.max_steps)}},
        {"seed", {"--seed", std::to_string(d.run.seed)}},
        {"optimizer", {"--optimizer", d.optim.name}},
        {"lr", {"--lr", text(d.optim.lr)}},
        {"momentum", {"--momentum", text(d.optim.momentum)}},
        {"weight-decay", {"--weight-decay", text(d.optim.weight_decay)}},
        {"beta1", {"--beta1", text(d.optim.beta1)}},
        {"beta2", {"--beta2", text(d.optim.beta2)}},
        {"eps", {"--eps", text(d.optim.eps)}},
        {"schedule", {"--schedule", d.optim.schedule}},
        {"milestones", {"--milestones", ""}},
        {"gamma", {"--gamma", text(d.optim.gamma)}},
        {"min-lr", {"--min-lr", text(d.optim.min_lr)}},
        {"warmup-epochs", {"--warmup-epochs", text(d.optim.warmup_epochs)}},
        {"warmup-steps", {"--warmup-steps", number(d.optim.warmup_steps)}}};
  }();
  return flags;
}

// The memory format ptrain trains the workload in, as its plan resolves --channels-last: auto (the default)
// is channels-last for convolutional models on CUDA.
bool ptrain_channels_last(const WorkloadKeys& workload, bool language_model, bool on_gpu) {
  if (language_model) return false;  // nothing 4-D to convert
  std::string value = workload_value(workload, "channels-last");
  if (value.empty()) value = config::TrainConfig{}.model.channels_last;
  return value == "auto" ? on_gpu : truthy(value);
}

Job pytorch_job(const Suite& suite, const SuiteRun& run, const std::string& variant, const BenchOptions& o,
                const std::string& out, const PytorchAbilities& abilities) {
  const bool compiled = variant == kPytorchCompiled;
  Job job{compiled ? kFrameworkPytorchCompiled : metrics::kFrameworkPytorch, run};
  job.metrics_path = out + "/runs/" + job.framework + "/" + run.id() + ".json";
  job.log_path = workload_folder(out, "logs", run) + "/" + job.framework + "-" + run.run_id() + ".log";
  // Checked as ptrain's run of the same job is: the same workload, data and schedule.
  job.train_arguments =
      ptrain_train_arguments(suite, run, out, out + "/runs/" + metrics::kFrameworkPtrain + "/" + run.id() + ".json");
  set_shape(job);
  if (run.master_weights) {
    job.unavailable = "PyTorch has no fp32 master weights for a model in pure half precision";
    return job;
  }
  if (run.strategy == "dp" && !suite.on_gpu) {
    job.unavailable = "PyTorch's DataParallel runs the module once on the CPU, without replicas";
    return job;
  }
  // PyTorch's own counterparts of the ZeRO stages: ZeroRedundancyOptimizer shards the optimizer state as
  // zero1 does; FSDP's full-shard shards parameters, gradients and optimizer state as zero3 does.
  std::string strategy = run.strategy;
  if (run.strategy == "zero2") {
    job.unavailable = "PyTorch has no ZeRO-2 of its own (FSDP's shard-grad-op, the nearest, is not in the reference)";
    return job;
  }
  if (run.strategy == "zero3" || run.strategy == "fsdp") {
    if (!suite.on_gpu) {
      job.unavailable = "PyTorch's FSDP in the reference needs CUDA";
      return job;
    }
    if (models::is_torchscript_path(workload_value(suite.workload_of(run), "model"))) {
      job.unavailable = "PyTorch's FSDP does not wrap TorchScript modules";
      return job;
    }
    strategy = "fsdp";
  }
  if (compiled) {
    if (strategy == "dp" || strategy == "fsdp") {
      job.unavailable = "the reference compiles single, ddp and zero1 runs, not " + strategy;
      return job;
    }
    if (!abilities.known) {
      job.unavailable = "cannot tell whether " + o.python + " has torch.compile: " + abilities.problem;
      return job;
    }
    if (!abilities.has_compile) {
      job.unavailable = "this PyTorch (torch " + abilities.torch_version + ") has no torch.compile (PyTorch 2.x)";
      return job;
    }
  }
  const WorkloadKeys& workload = suite.workload_of(run);
  const std::string model = workload_value(workload, "model");
  const bool language_model = models::is_language_model(model.empty() ? config::TrainConfig{}.model.name : model);
  const std::string script = o.source_dir + "/bench/pytorch_reference.py";
  std::vector<std::string> args{script, "--precision", run.precision, "--strategy", strategy,
                                "--metrics-out", job.metrics_path, "--device", suite.on_gpu ? "auto" : "cpu",
                                "--cache-dir", out + "/pytorch-cache"};
  if (strategy == "fsdp") args.insert(args.end(), {"--fsdp-min-params", kFsdpMinNumParams});
  // Keys without a counterpart, or with values it cannot honour, make the run unavailable, never silently different.
  for (const auto& [key, flag] : pytorch_flags()) {
    const std::string value = workload_value(workload, key);
    const std::string given = value.empty() ? flag.ptrain_default : value;
    if (!given.empty()) args.insert(args.end(), {flag.flag, given});
  }
  for (const auto& [key, value] : workload) {
    if (pytorch_flags().count(key) > 0 || key == "channels-last") {
      continue;
    } else if (key == "augment") {
      if (!truthy(value)) args.push_back("--no-augment");
    } else if (key == "nesterov") {
      args.push_back(truthy(value) ? "--nesterov" : "--no-nesterov");
    } else if (key == "eval-each-epoch" || key == "log-every" || key == "threads" || key == "loader-threads" ||
               key == "progress" || key == "prefetch") {
      // How often to evaluate or log, CPU threading and prefetching: no effect on what a run measures.
    } else {
      job.unavailable = "the PyTorch reference has no equivalent of workload key '" + key + "'";
      return job;
    }
  }
  // Eager runs in ptrain's memory format, the classic comparison; compiled is PyTorch at its best:
  // channels-last wherever there are convolutions, and the fused optimizer step.
  if (compiled ? !language_model : ptrain_channels_last(workload, language_model, suite.on_gpu)) {
    args.push_back("--channels-last");
  }
  if (compiled) args.insert(args.end(), {"--compile", "--fused-optimizer"});
  std::vector<std::string> command;
  if (compiled) {
    // Every compiled run of the bench shares TorchInductor's cache (kernels, graphs), kept with the bench's
    // other PyTorch caches: runs of one bench reuse what earlier ones compiled.
    command = {"env", "TORCHINDUCTOR_CACHE_DIR=" + out + "/pytorch-cache/inductor"};
  }
  command.push_back(o.python);
  if (one_process_per_device(run.strategy)) {
    command.insert(command.end(), {"-m", "torch.distributed.run", "--master_port", std::to_string(free_port()),
                                   "--nproc_per_node",
                                   std::to_string(run.devices), "--redirects", "1", "--tee", "1", "--log_dir",
                                   workload_folder(out, "logs", run) + "/torchrun-" +
                                       (compiled ? "compiled-" : "") + run.run_id()});
  } else if (run.strategy == "dp") {
    args.insert(args.end(), {"--gpus", std::to_string(run.devices)});
  }
  command.insert(command.end(), args.begin(), args.end());
  job.command = join_command(command);
  return job;
}

// The job's record when it is there and whole; nullopt otherwise.
std::optional<metrics::RunRecord> finished_record(const Job& job) {
  if (!fs::is_regular_file(job.metrics_path)) return std::nullopt;
  try {
    std::ifstream in(job.metrics_path);
    return metrics::run_record_from_json(nlohmann::json::parse(in));
  } catch (const std::exception&) {
    return std::nullopt;  // half a file from an interrupted run: run it again
  }
}

bool is_progress_line(const std::string& line) {
  const auto at = line.find("epoch ");
  return at != std::string::npos && (at == 0 || line.rfind("[rank 0] ", 0) == 0 || line.rfind("[pytorch]", 0) == 0);
}

struct Exit {
  int code = 0;
  bool interrupted = false;  // the bench was asked to stop (Ctrl-C, SIGTERM) while the run went on
  bool timed_out = false;    // stopped at the run timeout
  bool at_time_limit = false;  // stopped at the bench's time limit, left for the next bench
  std::string last_line;
  std::string error_line;  // the line of its output that says why it failed (run_log.h)
};

// Ctrl-C or SIGTERM for the bench, as the signal handler saw it: every running job passes it on to its
// run's process group and the bench stops after them.
volatile std::sig_atomic_t stop_signal = 0;
void remember_stop_signal(int signal_number) { stop_signal = signal_number; }

// Installs the handler for the bench's lifetime and restores the previous one after.
class StopSignals {
 public:
  StopSignals() {
    stop_signal = 0;
    struct sigaction action {};
    action.sa_handler = remember_stop_signal;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGINT, &action, &old_int_);
    ::sigaction(SIGTERM, &action, &old_term_);
  }
  ~StopSignals() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

// Progress lines from runs that may run side by side: whole lines, one writer at a time.
class ProgressSink {
 public:
  explicit ProgressSink(std::ostream& out) : out_(out) {}
  void line(const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex_);
    out_ << text << std::endl;
  }

 private:
  std::ostream& out_;
  std::mutex mutex_;
};

std::string gpu_list(const std::vector<int64_t>& gpus) {
  std::string list;
  for (auto g : gpus) list += (list.empty() ? "" : ",") + std::to_string(g);
  return list;
}

// Between SIGINT and SIGKILL when a run is stopped: time for ranks to leave their collectives.
constexpr double kKillGraceSeconds = 20;

// Runs the job's shell command in a process group of its own, so that a timeout or Ctrl-C reaches every
// process of the run (ptrain launch's ranks, torchrun's workers), and no process outlives it.
Exit run_job(const Job& job, const std::vector<int64_t>& gpus, const std::string& prefix, ProgressSink& progress,
             int64_t timeout_seconds, std::optional<std::chrono::steady_clock::time_point> time_limit) {
  fs::create_directories(fs::path(job.metrics_path).parent_path());
  fs::create_directories(fs::path(job.log_path).parent_path());
  const std::string command = command_on_gpus(job.command, gpus);
  std::ofstream log(job.log_path);
  log << "$ " << command << "\n";
  log.flush();
  int fds[2];
  check(::pipe(fds) == 0, "cannot start (no pipe): " + command);
  const pid_t pid = ::fork();
  check(pid >= 0, "cannot start (fork failed): " + command);
  if (pid == 0) {
    ::setpgid(0, 0);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: the child may not have run yet when a signal must reach its group
  ::close(fds[1]);

  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  std::optional<Clock::time_point> kill_at;
  Exit exit;
  enum class Why { interrupted, timed_out, time_limit };
  auto stop = [&](Why why) {
    if (kill_at) return;
    exit.timed_out = why == Why::timed_out;
    exit.at_time_limit = why == Why::time_limit;
    exit.interrupted = why == Why::interrupted;
    ::kill(-pid, SIGINT);
    kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kKillGraceSeconds));
  };
  std::string line;
  std::string output;  // what the run wrote, for the line that says why it failed
  std::array<char, 4096> buffer{};
  for (;;) {
    pollfd readable{fds[0], POLLIN, 0};
    const int ready = ::poll(&readable, 1, 200);
    if (stop_signal != 0) stop(Why::interrupted);
    if (timeout_seconds > 0 && Clock::now() - started > std::chrono::seconds(timeout_seconds)) stop(Why::timed_out);
    if (time_limit && Clock::now() > *time_limit) stop(Why::time_limit);
    if (kill_at && Clock::now() > *kill_at) ::kill(-pid, SIGKILL);
    if (ready <= 0) continue;
    const ssize_t n = ::read(fds[0], buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // every writer closed its end: the run is over
    for (ssize_t i = 0; i < n; ++i) {
      if (buffer[i] != '\n') {
        line += buffer[i];
        continue;
      }
      log << line << "\n";
      output += line + "\n";
      if (!line.empty()) exit.last_line = line;
      if (is_progress_line(line)) progress.line(prefix + line);
      line.clear();
    }
    log.flush();
  }
  ::close(fds[0]);
  if (!line.empty()) {
    log << line << "\n";
    output += line + "\n";
    exit.last_line = line;
  }
  exit.error_line = failure_line(output);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  ::kill(-pid, SIGKILL);  // whatever of the run detached from the pipe goes with it
  exit.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  if (exit.timed_out) log << "(stopped by ptrain bench after the --run-timeout of " << timeout_seconds << " s)\n";
  if (exit.at_time_limit) log << "(stopped by ptrain bench at its --time-limit; the next bench runs it again)\n";
  return exit;
}

std::string summary_of(const metrics::RunRecord& r) {
  char text[256];
  if (r.tokens_per_second) {
    std::snprintf(text, sizeof(text), "%.0f s, %.0f tokens/s", r.total_wall_seconds, *r.tokens_per_second);
  } else {
    std::snprintf(text, sizeof(text), "%.0f s, %.0f img/s", r.total_wall_seconds, r.images_per_second);
  }
  std::string s = text;
  if (r.final_test_accuracy) {
    std::snprintf(text, sizeof(text), ", test accuracy %.2f%%", *r.final_test_accuracy * 100);
    s += text;
  }
  if (r.peak_allocated_bytes) {
    std::snprintf(text, sizeof(text), ", peak %.2f GiB per GPU", static_cast<double>(*r.peak_allocated_bytes) / (1 << 30));
    s += text;
  }
  return s;
}

// The workload as bench.json keeps it: key -> value text; in a suite of several, "NAME/key" -> value.
nlohmann::json workload_json(const Suite& suite) {
  nlohmann::json workload = nlohmann::json::object();
  for (const auto& [k, v] : suite.workload) workload[k] = v;
  for (const auto& [name, keys] : suite.workloads) {
    for (const auto& [k, v] : keys) workload[name + "/" + k] = v;
  }
  return workload;
}

// Records kept from an earlier bench count as done only when that bench trained the same workload: runs
// of a shortened suite must not stand in for the full one's.
void check_same_workload(const Suite& suite, const std::string& bench_record) {
  if (!fs::is_regular_file(bench_record)) return;
  nlohmann::json earlier;
  try {
    std::ifstream in(bench_record);
    earlier = nlohmann::json::parse(in).at("workload");
  } catch (const std::exception&) {
    return;  // an unreadable record holds nothing to reuse wrongly; it is rewritten below
  }
  const nlohmann::json now = workload_json(suite);
  if (earlier == now) return;
  const auto text = [](const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
  std::string differences;
  for (const auto& [k, v] : now.items()) {
    if (!earlier.contains(k) || earlier[k] != v) {
      differences += " " + k + " " + (earlier.contains(k) ? text(earlier[k]) : "(unset)") + " -> " + text(v) + ";";
    }
  }
  for (const auto& [k, v] : earlier.items()) {
    if (!now.contains(k)) differences += " " + k + " " + text(v) + " -> (unset);";
  }
  throw Error("--out " + fs::path(bench_record).parent_path().string() +
              " holds runs of another workload (" + differences.substr(1, differences.size() - 2) +
              "): give another --out, or remove it to start over");
}

// The workload as each run's `ptrain train --config` will read it, read now: a bad key (from the suite file
// or a --set) stops the bench before any run instead of failing every run.
void check_workload_trains(const std::string& workload_file) {
  config::TrainConfig config;
  CLI::App app;
  config::add_train_options(app, config);
  app.parse(std::vector<std::string>{});
  config::apply_yaml_config(app, workload_file);
}

void write_bench_record(const Suite& suite, const BenchOptions& o, const std::vector<Job>& jobs,
                        const std::string& path) {
  nlohmann::json j;
  j["suite"] = suite.name;
  j["suite_file"] = suite.source;
  j["on_gpu"] = suite.on_gpu;
  j["side_by_side"] = o.side_by_side && suite.on_gpu;
  // The commit the running binary was built from: git in the source folder may know another history.
  j["git_commit"] = metrics::source_commit();
  j["ptrain_executable"] = o.ptrain_executable;
  j["workload"] = workload_json(suite);
  j["overrides"] = nlohmann::json::object();
  for (const auto& [k, v] : o.overrides) j["overrides"][k] = v;
  j["run_timeout_seconds"] = o.run_timeout_seconds;
  j["time_limit_seconds"] = o.time_limit_seconds;
  j["commands"] = nlohmann::json::array();
  for (const auto& job : jobs) {
    j["commands"].push_back({{"framework", job.framework}, {"run", job.run.id()}, {"command", job.command},
                             {"unavailable", job.unavailable}});
  }
  std::ofstream out(path);
  out << j.dump(2) << "\n";
}

// "ptrain fp32, single, 1 device (and 16 more): REASON; ..." per distinct reason, in job order.
std::string refusals_text(const std::vector<Job>& jobs, const std::map<size_t, std::string>& refused) {
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
    const Job& first = jobs[runs.front()];
    text += (r ? "; " : "") + first.framework + " " + first.run.id() +
            (runs.size() > 1 ? " (and " + std::to_string(runs.size() - 1) + " more)" : "") + ": " + reason;
  }
  return text;
}

// A run refused before it started keeps a log all the same, saying why, where its log would be.
void write_refusal_log(const Job& job, const std::string& reason) {
  fs::create_directories(fs::path(job.log_path).parent_path());
  std::ofstream log(job.log_path);
  log << "ptrain bench: not started: " << reason << "\n";
}

bool asks_for_compiled(const Suite& suite) {
  return std::any_of(suite.runs.begin(), suite.runs.end(), [](const SuiteRun& run) {
    return std::find(run.pytorch.begin(), run.pytorch.end(), kPytorchCompiled) != run.pytorch.end();
  });
}

}  // namespace

PytorchAbilities probe_pytorch(const std::string& python) {
  PytorchAbilities abilities;
  const std::string command =
      quoted(python) + " -c " + quoted("import torch; print('torch', torch.__version__, hasattr(torch, 'compile'))") +
      " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    abilities.problem = "cannot start " + python;
    return abilities;
  }
  std::string output;
  std::array<char, 512> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe) != nullptr) output += buffer.data();
  const int status = ::pclose(pipe);
  std::istringstream words(output.substr(output.rfind("torch ") == std::string::npos ? 0 : output.rfind("torch ")));
  std::string torch_word, version, has_compile;
  if (status == 0 && (words >> torch_word >> version >> has_compile) && torch_word == "torch") {
    abilities.known = true;
    abilities.torch_version = version;
    abilities.has_compile = has_compile == "True";
  } else {
    const auto newline = output.find_last_not_of("\n");
    const std::string last = output.substr(0, newline == std::string::npos ? 0 : newline + 1);
    abilities.problem = python + " -c 'import torch' failed" +
                        (last.empty() ? "" : ": " + last.substr(last.rfind('\n') == std::string::npos ? 0 : last.rfind('\n') + 1));
  }
  return abilities;
}

std::string command_on_gpus(const std::string& command, const std::vector<int64_t>& gpus) {
  // Exported, not a prefix of the command: a prefix reaches only the first command of `a && b; c`.
  return gpus.empty() ? command : "export CUDA_VISIBLE_DEVICES=" + gpu_list(gpus) + "; " + command;
}

std::vector<BenchJob> plan_jobs(const Suite& suite, const BenchOptions& o, const std::string& out,
                                const PytorchAbilities& pytorch) {
  std::vector<BenchJob> jobs;
  for (const auto& run : suite.runs) {
    if (run.ptrain) jobs.push_back(ptrain_job(suite, run, o, out));
    if (!o.pytorch) continue;
    for (const auto& variant : run.pytorch) jobs.push_back(pytorch_job(suite, run, variant, o, out, pytorch));
  }
  return jobs;
}

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
  if (o.pytorch) {
    check(fs::is_regular_file(o.source_dir + "/bench/pytorch_reference.py"),
          "--pytorch: no bench/pytorch_reference.py under " + o.source_dir);
  }

  const std::string out = fs::absolute(o.out_dir).lexically_normal().string();
  fs::create_directories(out);
  check_same_workload(suite, out + "/bench.json");
  if (suite.has_several_workloads()) {
    for (const auto& [name, keys] : suite.workloads) {
      SuiteRun of_workload;
      of_workload.workload = name;
      write_workload_file(suite, name, keys, workload_file_of(out, of_workload));
      check_workload_trains(workload_file_of(out, of_workload));
    }
  } else {
    write_workload_file(suite, "", suite.workload, out + "/workload.yaml");
    check_workload_trains(out + "/workload.yaml");
  }

  const PytorchAbilities pytorch = o.pytorch && asks_for_compiled(suite) ? probe_pytorch(o.python) : PytorchAbilities{};
  std::vector<Job> jobs = plan_jobs(suite, o, out, pytorch);
  const std::set<std::string> skip(o.skip.begin(), o.skip.end());
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
                "; prefix ptrain/, pytorch/ or pytorch-compiled/ for one framework's)");
  }
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
  if (o.pytorch && asks_for_compiled(suite)) {
    progress << "PyTorch for the reference: "
             << (pytorch.known ? "torch " + pytorch.torch_version +
                                     (pytorch.has_compile ? ", with torch.compile" : ", without torch.compile")
                               : pytorch.problem)
             << std::endl;
  }
  BenchOutcome outcome;
  ProgressSink sink(progress);
  std::mutex mutex;  // guards outcome and interrupted
  std::string interrupted;
  std::vector<size_t> to_run;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& job = jobs[i];
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
    const Job& job = jobs[i];
    if (stop_signal != 0) {
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
    Exit exit;
    try {
      exit = run_job(job, visible, prefix, sink, o.run_timeout_seconds, time_limit);
    } catch (const std::exception& e) {
      exit.code = 127;
      exit.last_line = exit.error_line = e.what();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
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
    if (exit.code == 0) attach_estimate(job);
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
    outcome.report = write_report({out + "/runs"}, out, "ptrain bench: " + suite.name);
  }
  return outcome;
}

}  // namespace ptrain::bench
