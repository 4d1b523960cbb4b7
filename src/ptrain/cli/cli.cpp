#include "ptrain/cli/cli.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>

#include "ptrain/bench/runner.h"
#include "ptrain/bench/suite.h"
#include "ptrain/cli/dry_run.h"
#include "ptrain/cli/rank_output.h"
#include "ptrain/cli/stop_signals.h"
#include "ptrain/cli/verify.h"
#include "ptrain/config/accelerate_config.h"
#include "ptrain/config/cli_options.h"
#include "ptrain/config/deepspeed_config.h"
#include "ptrain/config/help_format.h"
#include "ptrain/config/near_names.h"
#include "ptrain/config/number_checks.h"
#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/distributed/launch_environment.h"
#include "ptrain/distributed/launcher.h"
#include "ptrain/estimate/estimate.h"
#include "ptrain/io/atomic_file.h"
#include "ptrain/io/output_path.h"
#include "ptrain/metrics/run_record.h"
#include "ptrain/report/report.h"
#include "ptrain/train/plan.h"
#include "ptrain/train/progress.h"
#include "ptrain/train/trainer.h"

namespace ptrain::cli {

namespace {

std::string joined(int argc, char** argv) {
  std::ostringstream out;
  for (int i = 0; i < argc; ++i) out << (i ? " " : "") << argv[i];
  return out.str();
}

// LibTorch's messages carry a C++ source location and sometimes a stack on the lines after the first.
std::string first_line(const std::string& text) {
  const auto newline = text.find('\n');
  return newline == std::string::npos ? text : text.substr(0, newline);
}

std::string gib(std::optional<int64_t> bytes) {
  if (!bytes) return "n/a";
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GiB", static_cast<double>(*bytes) / (1024.0 * 1024.0 * 1024.0));
  return text;
}

std::string percent(std::optional<double> value) {
  if (!value) return "n/a";
  char text[32];
  std::snprintf(text, sizeof(text), "%.0f%%", *value);
  return text;
}

// Fills the launcher options the command line left unset, and exports the environment the started
// processes read.
void apply_accelerate_config(CLI::App& launch_cmd, const std::string& path, distributed::LaunchOptions& options) {
  const config::AccelerateLaunch launch = config::read_accelerate_config(path);
  const auto unset = [&](const char* flag) { return launch_cmd.get_option(flag)->count() == 0; };
  if (unset("--nproc-per-node")) {
    options.nproc_per_node = launch.num_processes_per_machine;
    options.nproc_source = path + ": key 'num_processes'" + (launch.num_machines > 1 ? " (per machine)" : "");
  }
  if (unset("--nnodes")) options.nnodes = launch.num_machines;
  if (unset("--node-rank")) options.node_rank = launch.machine_rank;
  if (unset("--master-addr")) options.master_addr = launch.main_process_ip;
  if (unset("--master-port") && launch.main_process_port != 0) options.master_port = launch.main_process_port;
  for (const auto& warning : launch.warnings) std::cerr << "ptrain: warning: " << warning << std::endl;
  for (const auto& [name, value] : launch.environment) ::setenv(name.c_str(), value.c_str(), 1);
}

// Every config source into one TrainConfig, as train and estimate both read them: the flags (already
// parsed into config), then --config YAML, then --deepspeed-config, each filling what the ones before
// left unset. job: the processes the job runs (a ds_config's batch keys count them), asked only when a
// ds_config is given; rank 0 prints the warnings.
void apply_config_sources(CLI::App& cmd, CLI::Option* config_file, config::TrainConfig& config,
                          const std::function<distributed::LaunchEnvironment()>& job) {
  if (config_file->count() > 0) config::apply_yaml_config(cmd, config_file->as<std::string>());
  if (config.run.deepspeed_config.empty()) return;
  const distributed::LaunchEnvironment env = job();
  const auto warnings = config::apply_deepspeed_config(cmd, config, config.run.deepspeed_config, env.world_size);
  if (env.rank == 0) {
    for (const auto& warning : warnings) std::cerr << "ptrain: warning: " << warning << std::endl;
  }
}

void print_result(const metrics::RunRecord& r) {
  char line[512];
  // A language model's rates in tokens/s, as its record has them.
  const int64_t seq_len = r.seq_len.value_or(0);
  std::snprintf(line, sizeof(line), "result: %s %s on %s, %lld steps in %s (training %s), %s", r.model.c_str(),
                r.precision.c_str(), r.device.c_str(), static_cast<long long>(r.steps),
                train::format_duration(r.total_wall_seconds).c_str(),
                train::format_duration(r.train_wall_seconds).c_str(),
                train::throughput_text(r.images_per_second, seq_len).c_str());
  std::cout << line;
  if (r.steady_images_per_second && r.steady_from_step) {
    const std::string steady = train::throughput_text(*r.steady_images_per_second, seq_len);
    std::snprintf(line, sizeof(line), " (%s after step %lld)", steady.substr(0, steady.find(' ')).c_str(),
                  static_cast<long long>(*r.steady_from_step));
    std::cout << line;
  }
  std::cout << "\n";
  if (r.tflops) {
    std::snprintf(line, sizeof(line), "result: model %.4g TFLOP a step, %.1f TFLOP/s a device", *r.model_flops_per_step / 1e12,
                  *r.tflops);
    std::cout << line;
    if (r.mfu) {
      std::snprintf(line, sizeof(line), ", MFU %.1f%% of %.1f (%s)", *r.mfu * 100.0, *r.peak_tflops,
                    r.peak_tflops_basis.c_str());
      std::cout << line;
    }
    std::cout << "\n";
  }
  if (r.final_test_accuracy) {
    std::snprintf(line, sizeof(line), "result: test accuracy %.2f%%, test loss %.4f", *r.final_test_accuracy * 100.0,
                  *r.final_test_loss);
    std::cout << line << "\n";
  }
  std::cout << "result: peak memory allocated " << gib(r.peak_allocated_bytes) << ", reserved "
            << gib(r.peak_reserved_bytes) << ", device (NVML) " << gib(r.peak_nvml_used_bytes) << ", host RSS "
            << gib(r.host_peak_rss_bytes) << "; GPU utilisation mean " << percent(r.gpu_util_mean) << ", peak "
            << percent(r.gpu_util_peak) << std::endl;
}

// A subcommand reads its options' PTRAIN_* variables only when it is the command given: CLI11 otherwise reads
// and checks them for every subcommand at the end of the parse, so that a bad PTRAIN_LR failed `ptrain
// bench` (in estimate's --lr) and `ptrain train --lr 0.1` alike. A subcommand with a parse-complete
// callback processes its variables itself, once its own arguments are parsed.
void read_variables_only_when_given(CLI::App& command) {
  command.parse_complete_callback([] {});
}

// The subcommands, each its options (which CLI11 writes into, so they live as long as the parse) and
// what it runs once the command line is parsed.

struct TrainCommand {
  config::TrainConfig config;
  CLI::App* cmd = nullptr;
  CLI::Option* config_file = nullptr;
};

void add_train_command(CLI::App& app, TrainCommand& command) {
  command.cmd = app.add_subcommand("train", "Train a model");
  command.config_file = config::add_train_options(*command.cmd, command.config);
  read_variables_only_when_given(*command.cmd);
}

int run_train(TrainCommand& command, const std::string& command_line) {
  config::TrainConfig& train_config = command.config;
  apply_config_sources(*command.cmd, command.config_file, train_config, [] { return distributed::detect_environment(); });
  const train::Plan plan = train::make_plan(train_config);
  // Errors any rank finds after this still show, prefixed by its rank under ptrain launch.
  const RankOutput output(plan.launch.rank != 0 && !train_config.run.log_all_ranks);
  if (train_config.run.dry_run) {
    check_plan_on_data(plan);
    std::cout << train::describe(plan) << describe_layout(plan) << std::endl;
    return 0;
  }
  const auto write_record = [&](const metrics::RunRecord& record) {
    if (train_config.run.metrics_out.empty()) return;
    const auto parent = std::filesystem::path(train_config.run.metrics_out).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    metrics::write_run_record(train_config.run.metrics_out, record);
    std::cout << "metrics written to " << train_config.run.metrics_out << std::endl;
  };
  const StopSignals stop_signals;
  train::TrainHooks hooks;
  hooks.stop_signal = &StopSignals::received;
  metrics::RunRecord record;
  try {
    record = train::train(plan, command_line, hooks);
  } catch (const train::RunStopped& stopped) {
    // Stopped by a signal, or failed once trained: the record says so, the line says what was kept.
    if (plan.launch.rank != 0) return stopped.exit_code();
    // The line first: it says where the trained state is, even if the record cannot be written.
    std::cerr << (stopped.interrupted() ? "ptrain: " : "ptrain: error: ") << stopped.what() << std::endl;
    write_record(stopped.record());
    return stopped.exit_code();
  }
  if (plan.launch.rank != 0) return record.diverged_at_step ? kExitError : kExitSuccess;  // rank 0 speaks for the job
  print_result(record);
  write_record(record);
  if (record.diverged_at_step) {
    std::cerr << "ptrain: error: training diverged at step " << *record.diverged_at_step
              << " (--on-divergence warn trained on): its results mean nothing" << std::endl;
    return kExitError;
  }
  return kExitSuccess;
}

struct LaunchCommand {
  distributed::LaunchOptions options;
  std::string accelerate_config;
  CLI::App* cmd = nullptr;
  CLI::Option* accelerate_option = nullptr;
};

void add_launch_command(CLI::App& app, LaunchCommand& command) {
  distributed::LaunchOptions& launch_options = command.options;
  CLI::App* launch_cmd = app.add_subcommand(
      "launch", "Start one process per device on this node with torchrun's variables (RANK, WORLD_SIZE, ...)");
  command.cmd = launch_cmd;
  launch_cmd->add_option("--nproc-per-node", launch_options.nproc_per_node, "Processes on this node")
      ->check(config::positive_number())->capture_default_str();
  launch_cmd->add_option("--nnodes", launch_options.nnodes, "Nodes in the job")->check(config::positive_number())->capture_default_str();
  launch_cmd->add_option("--node-rank", launch_options.node_rank, "This node's rank")->check(config::non_negative_number())->capture_default_str();
  launch_cmd->add_option("--master-addr", launch_options.master_addr, "Address of node 0")->capture_default_str();
  launch_cmd->add_option("--master-port", launch_options.master_port,
                         "Rendezvous port on node 0 (default: a free port on a single node, 29500 across nodes)")
      ->check(config::number_in(1, 65535));
  launch_cmd->add_option("--rdzv-id", launch_options.run_id,
                         "The job's id, which every rank checks at the rendezvous so that none joins another job's "
                         "(TORCHELASTIC_RUN_ID; default: that variable, else a random id on a single node; give every "
                         "node the same)");
  launch_cmd->add_option("--timeout", launch_options.timeout_seconds, "Wall-clock limit of the whole job in seconds; 0: none")
      ->check(config::non_negative_number())->capture_default_str();
  launch_cmd->add_option("--max-restarts", launch_options.max_restarts,
                         "When a rank fails, stop every rank and start the job again, at most this many times; "
                         "ptrain train resumes from the newest checkpoint of its --checkpoint-dir (from the start "
                         "before the first). A rank exiting with code 2 (a usage error) is not retried")
      ->check(config::non_negative_number())->capture_default_str();
  launch_cmd->add_flag("--allow-oversubscribe", launch_options.allow_oversubscribe,
                       "Start more processes than this node has GPUs (a job on GPUs) or cores (otherwise)");
  launch_cmd->add_option("command", launch_options.command, "Program and arguments, after --")->required();
  command.accelerate_option = launch_cmd->add_option(
      "--config", command.accelerate_config,
      "An accelerate config YAML (distributed_type NO, MULTI_GPU, MULTI_CPU, FSDP, DEEPSPEED): processes, "
      "machines, rendezvous, and for ptrain train the strategy, precision, device, fsdp_config and "
      "deepspeed_config keys (through the PTRAIN_* variable of each train flag; flags win)");
}

int run_launch(LaunchCommand& command) {
  if (command.accelerate_option->count() > 0) apply_accelerate_config(*command.cmd, command.accelerate_config, command.options);
  command.options.config_device = config::device_in_train_config(command.options.command);
  return distributed::launch(command.options);
}

struct ReportCommand {
  std::vector<std::string> run_dirs;
  std::string out_dir;
  std::string title = "ptrain benchmark report";
  CLI::App* cmd = nullptr;
};

void add_report_command(CLI::App& app, ReportCommand& command) {
  CLI::App* report_cmd = app.add_subcommand(
      "report",
      "Compare run records, ptrain's and PyTorch references' (bench/pytorch_reference.py): writes report.md "
      "(also printed), report.csv and report.html, a self-contained page with charts");
  command.cmd = report_cmd;
  report_cmd->add_option("--runs", command.run_dirs, "Directory of run records (*.json, searched recursively); repeat for more")
      ->required()->check(CLI::ExistingDirectory);
  report_cmd->add_option("--out", command.out_dir, "Directory for report.md, report.csv and report.html (created when missing)")
      ->required();
  report_cmd->add_option("--title", command.title, "Heading of the report")->capture_default_str();
}

int run_report(const ReportCommand& command) {
  const report::WrittenReport written = report::write_report(command.run_dirs, command.out_dir, command.title);
  for (const auto& file : written.skipped) std::cerr << "ptrain: note: left out " << file << std::endl;
  std::cout << written.markdown << "report written to " << written.markdown_path << ", " << written.csv_path
            << " and " << written.html_path << std::endl;
  return 0;
}

struct BenchCommand {
  bench::BenchOptions options;
  std::vector<std::string> overrides;  // --set KEY=VALUE, parsed once the command line is
  CLI::App* cmd = nullptr;
};

void add_bench_command(CLI::App& app, BenchCommand& command) {
  bench::BenchOptions& bench_options = command.options;
  CLI::App* bench_cmd = app.add_subcommand(
      "bench",
      "Run a whole comparison (a suite: one workload or several, many precisions and strategies), each run in "
      "its own process, then write the report; an interrupted bench continues where it stopped");
  command.cmd = bench_cmd;
  bench_cmd->add_option("--suite", bench_options.suite,
                        "A suite name under configs/bench (standard, quick, speed, fp8, fusions, strategies, "
                        "your-model) or a YAML file")
      ->capture_default_str();
  bench_cmd->add_option("--out", bench_options.out_dir, "Directory for the runs' records, logs and the report")
      ->capture_default_str();
  bench_cmd->add_option("--gpus", bench_options.gpus, "GPUs to use (default: every visible one; 0: the CPU)")
      ->check(config::non_negative_number());
  bench_cmd->add_flag("--pytorch", bench_options.pytorch,
                      "Also run every run through PyTorch (bench/pytorch_reference.py), eager and compiled as each "
                      "run asks, for the report to compare");
  bench_cmd->add_flag("--side-by-side", bench_options.side_by_side,
                      "Start runs that need fewer GPUs than there are side by side, each on GPUs of its own");
  bench_cmd->add_flag("--estimate,!--no-estimate", bench_options.estimate,
                      "Predict each ptrain run's peak memory first (ptrain estimate), for the report to show beside "
                      "the measurement (default: on)");
  bench_cmd->add_option("--set", command.overrides,
                        "KEY=VALUE: a workload key over the suite file's, e.g. --set max-steps=60 (repeatable); in a "
                        "suite of several workloads every one's, or NAME/KEY=VALUE the one named");
  bench_cmd->add_option("--run-timeout", bench_options.run_timeout_seconds,
                        "Stop a run still going after this many seconds and report it as failed (default 0: no limit)")
      ->check(config::non_negative_number());
  bench_cmd->add_option("--time-limit", bench_options.time_limit_seconds,
                        "Start no run after this many seconds, stop the one going then and write the report of what "
                        "finished; the next bench with the same --out runs the rest (default 0: no limit)")
      ->check(config::non_negative_number());
  bench_cmd->add_option("--repeat", bench_options.repeat,
                        "Run each run's ptrain and PyTorch jobs N times in turn (A B A B ...); the report gives each "
                        "ratio as the median with its range over the N pairs and marks noisy ones (default 1)")
      ->check(config::positive_number());
  bench_cmd->add_option("--skip", bench_options.skip,
                        "Leave a run out: its id (fp32-dp-x2, every framework) or its record's path under runs/ "
                        "(ptrain/fp32-dp-x2, pytorch/..., pytorch-compiled/..., pytorch-compiled-default/...; "
                        "WORKLOAD/RUN ids in a suite of several workloads); repeatable");
  bench_cmd->add_option("--python", bench_options.python, "The Python with torch and torchvision for --pytorch")
      ->capture_default_str();
  bench_cmd->add_option("--source-dir", bench_options.source_dir,
                        "The ptrain checkout holding configs/bench and bench/ (default: the current directory "
                        "when it has them, else the one ptrain was built from)");
}

int run_bench(BenchCommand& command) {
  bench::BenchOptions& bench_options = command.options;
  if (bench_options.source_dir.empty()) {
    bench_options.source_dir =
        std::filesystem::is_directory("configs/bench") ? std::filesystem::current_path().string() : PTRAIN_SOURCE_DIR;
  }
  // Before the suite is read or anything runs: the records, logs and report all go under --out.
  io::check_outputs({{"--out", bench_options.out_dir, io::OutputPath::Kind::owned_directory}});
  bench_options.ptrain_executable = std::filesystem::read_symlink("/proc/self/exe").string();
  for (const auto& text : command.overrides) bench_options.overrides.push_back(bench::parse_override(text));
  const bench::BenchOutcome outcome = bench::run_bench(bench_options, std::cout);
  if (!outcome.report.markdown.empty()) {
    std::cout << "\n" << outcome.report.markdown << "report written to " << outcome.report.markdown_path << ", "
              << outcome.report.csv_path << " and " << outcome.report.html_path << std::endl;
  }
  std::cout << "ptrain bench: " << outcome.completed << " run(s) done now, " << outcome.done_earlier
            << " earlier, " << outcome.not_available << " not available, " << outcome.failed << " failed"
            << (outcome.estimates_failed > 0
                    ? "; " + std::to_string(outcome.estimates_failed) + " estimate(s) failed, their runs without a prediction"
                    : std::string())
            << (outcome.left_for_later > 0 ? ", " + std::to_string(outcome.left_for_later) +
                                                 " left for the next bench (--time-limit)"
                                           : std::string())
            << std::endl;
  for (const auto& failure : outcome.failures) std::cerr << "ptrain: failed: " << failure << std::endl;
  for (const auto& failure : outcome.estimate_failures)
    std::cerr << "ptrain: failed: the estimate of " << failure << std::endl;
  return outcome.failed > 0 ? kExitFailedRuns : kExitSuccess;
}

struct EstimateCommand {
  config::TrainConfig config;
  int64_t devices = 0;
  std::string json_path;
  CLI::App* cmd = nullptr;
  CLI::Option* config_file = nullptr;
};

void add_estimate_command(CLI::App& app, EstimateCommand& command) {
  CLI::App* estimate_cmd = app.add_subcommand(
      "estimate",
      "Predict the memory each device needs for a training run (the train flags), under every strategy: model "
      "states by each strategy's arithmetic, activations measured by two short probe runs at small batches");
  command.cmd = estimate_cmd;
  command.config_file = config::add_train_options(*estimate_cmd, command.config);
  read_variables_only_when_given(*estimate_cmd);
  estimate_cmd->add_option("--devices", command.devices,
                           "Devices the multi-device strategies spread over; unset: the visible GPUs, 2 on the CPU")
      ->check(config::positive_number());
  estimate_cmd->add_option("--json", command.json_path, "Also write the estimate as JSON to this file");
}

int run_estimate(EstimateCommand& command) {
  const std::string& estimate_json = command.json_path;
  io::check_outputs({{"--json", estimate_json, io::OutputPath::Kind::file}});
  int64_t devices = command.devices;
  if (devices == 0) devices = torch::cuda::is_available() ? std::max<int64_t>(1, torch::cuda::device_count()) : 2;
  // The estimate is of the job over `devices` devices: a ds_config's batch keys count them.
  apply_config_sources(*command.cmd, command.config_file, command.config, [devices] {
    distributed::LaunchEnvironment job;
    job.world_size = devices;
    return job;
  });
  const estimate::MemoryEstimate estimate = estimate::estimate_memory(command.config, devices);
  std::cout << estimate::render_estimate(estimate);
  if (!estimate_json.empty()) {
    const auto parent = std::filesystem::path(estimate_json).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    io::write_file_atomically(estimate_json, estimate::to_json(estimate).dump(2) + "\n");
  }
  return 0;
}

struct VerifyCommand {
  std::vector<std::string> files;
  CLI::App* cmd = nullptr;
};

void add_verify_command(CLI::App& app, VerifyCommand& command) {
  command.cmd = app.add_subcommand(
      "verify",
      "Check checkpoint files as a resume reads them (checksums, metadata, rank files, finite values) and print "
      "each one's step and a digest of its weights");
  command.cmd->add_option("files", command.files, "Checkpoint files")->required();
}

// Runs command; an error it throws becomes one line on stderr and kExitError (kExitLibTorchError for LibTorch's own).
int with_errors_reported(const std::function<int()>& command) {
  try {
    return command();
  } catch (const Error& e) {
    std::cerr << "ptrain: error: " << e.what() << std::endl;
    return kExitError;
  } catch (const c10::Error& e) {
    std::cerr << "ptrain: LibTorch error: " << first_line(e.what_without_backtrace()) << std::endl;
    return kExitLibTorchError;
  } catch (const std::filesystem::filesystem_error& e) {
    // e.g. a directory to create under a regular file: the message names the paths.
    std::cerr << "ptrain: error: " << e.what() << std::endl;
    return kExitError;
  } catch (const std::bad_alloc&) {
    std::cerr << "ptrain: error: out of host memory" << std::endl;
    return kExitError;
  } catch (const std::exception& e) {
    std::cerr << "ptrain: error: " << e.what() << std::endl;
    return kExitError;
  } catch (...) {
    std::cerr << "ptrain: error: unknown exception" << std::endl;
    return kExitError;
  }
}

std::string joined_names(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) text += (i == 0 ? "" : ", ") + names[i];
  return text;
}

bool names_option(const CLI::Option& opt, const std::string& arg) {
  for (const auto& name : opt.get_lnames()) {
    const std::string flag = "--" + name;
    if (arg == flag || arg.rfind(flag + "=", 0) == 0) return true;
  }
  for (const auto& name : opt.get_snames())
    if (arg.rfind("-" + name, 0) == 0 && arg.rfind("--", 0) != 0) return true;
  return false;
}

// CLI11 names the option whose value it refused ("--lr: 'abc' is not a number"); where the value came
// from the option's PTRAIN_* variable, not the command line, the line names the variable.
std::string naming_the_variable(const CLI::App& command, std::string message, const std::vector<std::string>& args) {
  for (const CLI::Option* opt : command.get_options()) {
    const std::string& variable = opt->get_envname();
    if (variable.empty() || std::getenv(variable.c_str()) == nullptr) continue;
    const std::string flag = opt->get_name();
    const auto at = message.find(flag);
    if (at == std::string::npos) continue;
    const size_t end = at + flag.size();
    if (end < message.size() && (std::isalnum(static_cast<unsigned char>(message[end])) || message[end] == '-')) continue;
    if (std::any_of(args.begin(), args.end(), [&](const std::string& arg) { return names_option(*opt, arg); })) continue;
    return message.replace(at, flag.size(), variable + "=" + std::getenv(variable.c_str())) +
           " (the environment variable " + variable + " sets " + flag + ")";
  }
  return message;
}

// The one line a usage error CLI11 found says: a command or flag that does not exist (with the near
// names of a typo), or the flag or PTRAIN_* variable whose value was refused.
std::string usage_error(CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const auto parsed = app.get_subcommands();
  if (parsed.empty()) {
    std::vector<std::string> commands;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) commands.push_back(sub->get_name());
    const auto word = std::find_if(args.begin(), args.end(), [](const std::string& a) { return a.rfind('-', 0) != 0; });
    if (word != args.end() && std::find(commands.begin(), commands.end(), *word) == commands.end()) {
      return "'" + *word + "' is not a ptrain command" + config::did_you_mean(*word, commands) + "; the commands: " +
             joined_names(commands);
    }
    if (!args.empty()) return "ptrain has no option " + args.front() + " before its command (" + joined_names(commands) + ")";
    return "a command is required: " + joined_names(commands) + " (ptrain --help says what each does)";
  }
  const CLI::App& command = *parsed.front();
  const std::string name = "ptrain " + command.get_name();
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    const auto extras = app.remaining(true);
    for (const auto& arg : args) {
      if (arg.rfind("--", 0) != 0 || std::find(extras.begin(), extras.end(), arg) == extras.end()) continue;
      const std::string flag = arg.substr(0, arg.find('='));
      std::vector<std::string> flags;
      for (const CLI::Option* opt : command.get_options())
        for (const auto& long_name : opt->get_lnames()) flags.push_back(long_name);
      const std::string near = config::did_you_mean(flag.substr(2), flags, "--");
      return name + " has no flag " + flag + (near.empty() ? "; " + name + " --help lists its flags" : near);
    }
    if (!extras.empty()) return name + ": unexpected argument '" + extras.front() + "' (" + name + " --help)";
  }
  return naming_the_variable(command, config::usage_message(e), args);
}

}  // namespace

int run_cli(int argc, char** argv) {
  CLI::App app{"ptrain: train neural networks in every precision and strategy, and measure what each costs"};
  app.formatter(std::make_shared<config::HelpFormatter>());  // the subcommands' too, added after it
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("ptrain 0.1.0, LibTorch ") + compat::torch_version());
  TrainCommand train_command;
  add_train_command(app, train_command);
  LaunchCommand launch_command;
  add_launch_command(app, launch_command);
  ReportCommand report_command;
  add_report_command(app, report_command);
  BenchCommand bench_command;
  add_bench_command(app, bench_command);
  EstimateCommand estimate_command;
  add_estimate_command(app, estimate_command);
  VerifyCommand verify_command;
  add_verify_command(app, verify_command);
  config::read_numbers_as_decimal(app);  // the options of launch, bench and estimate's own too

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version end parsing as CLI11 "errors" that succeed; every other is a usage error, said
    // as every ptrain error is: one line, exit 2 (CLI11's own codes, 105 and up, told scripts nothing).
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::cerr << "ptrain: error: " << usage_error(app, e, argc, argv) << std::endl;
    return kExitError;
  }
  return with_errors_reported([&] {
    if (bench_command.cmd->parsed()) return run_bench(bench_command);
    if (estimate_command.cmd->parsed()) return run_estimate(estimate_command);
    if (verify_command.cmd->parsed()) return verify_checkpoints(verify_command.files, std::cout) > 0 ? kExitError : kExitSuccess;
    if (report_command.cmd->parsed()) return run_report(report_command);
    if (launch_command.cmd->parsed()) return run_launch(launch_command);
    if (train_command.cmd->parsed()) return run_train(train_command, joined(argc, argv));
    return 0;
  });
}

}  // namespace ptrain::cli
