// ptrain's job: `ptrain train` on the workload's --config file with the run's precision and strategy (under
// `ptrain launch` for the strategies of one process a device), after `ptrain estimate` predicts its memory.
#include <algorithm>
#include <thread>

#include "ptrain/bench/jobs.h"
#include "ptrain/core/text.h"
#include "ptrain/metrics/run_record.h"
#include "ptrain/report/report_curves.h"

namespace ptrain::bench {

namespace {

// A run of its own batch-size trains its workload's file with the batch (and train-limit, scaled with it,
// Suite::run_workload) as flags, which win over the file's keys.
void append_batch_size(const Suite& suite, const SuiteRun& run, std::vector<std::string>& arguments) {
  if (!run.batch_size) return;
  const WorkloadKeys workload = suite.run_workload(run);
  arguments.insert(arguments.end(), {"--batch-size", workload_value(workload, "batch-size")});
  const std::string limit = workload_value(workload, "train-limit");
  if (!limit.empty()) arguments.insert(arguments.end(), {"--train-limit", limit});
}

}  // namespace

std::vector<std::string> ptrain_train_arguments(const Suite& suite, const SuiteRun& run, const std::string& out,
                                                const std::string& metrics_path) {
  std::vector<std::string> train{"--config", workload_file_of(out, run), "--precision", run.precision,
                                 "--strategy", run.strategy, "--progress", "lines", "--metrics-out", metrics_path,
                                 // The report's curves per step (report_curves.h) come from this log.
                                 "--log-jsonl", report::step_log_path_of(metrics_path)};
  const strategies::StrategySpec spec = run.spec();
  if (run.master_weights) train.push_back("--master-weights");
  if (run.fp8_delayed_scaling) train.insert(train.end(), {"--fp8-scaling", "delayed"});
  if (run.fp8_head) train.push_back("--fp8-head");
  if (!run.skip_fusions.empty()) train.insert(train.end(), {"--skip-fusions", join(run.skip_fusions, ",")});
  if (spec.takes_fsdp_options()) train.insert(train.end(), {"--min-num-params", kFsdpMinNumParams});
  append_batch_size(suite, run, train);
  const bool gpu = suite.on_gpu;
  if (spec.drives_several_devices()) {
    train.insert(train.end(), {"--device", gpu ? "cuda:0" : "cpu", "--replicas", std::to_string(run.devices)});
  } else if (spec.multi_process()) {
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

BenchJob ptrain_job(const Suite& suite, const SuiteRun& run, const BenchOptions& o, const std::string& out,
                    int64_t repeat) {
  BenchJob job;
  job.framework = metrics::kFrameworkPtrain;
  job.run = run;
  job.repeat = repeat;
  const std::string workload_file = workload_file_of(out, run);
  job.metrics_path = out + "/runs/ptrain/" + run.id() + repeat_suffix(repeat) + ".json";
  job.log_path = workload_folder(out, "logs", run) + "/ptrain-" + run.run_id() + repeat_suffix(repeat) + ".log";
  job.train_arguments = ptrain_train_arguments(suite, run, out, job.metrics_path);
  set_shape(job);
  const bool gpu = suite.on_gpu;
  std::vector<std::string> train{o.ptrain_executable, "train"};
  train.insert(train.end(), job.train_arguments.begin(), job.train_arguments.end());
  if (run.spec().multi_process()) {
    std::vector<std::string> launch{o.ptrain_executable, "launch", "--nproc-per-node", std::to_string(run.devices),
                                    "--master-port", std::to_string(free_port()), "--"};
    train.insert(train.begin(), launch.begin(), launch.end());
  }
  job.command = join_command(train);
  // The prediction is the same every round: the first one's.
  if (o.estimate && suite.estimate && repeat == 1) {
    job.estimate_path = workload_folder(out, "estimates", run) + "/" + run.run_id() + ".json";
    std::vector<std::string> estimate{o.ptrain_executable, "estimate", "--config", workload_file, "--precision",
                                      run.precision, "--strategy", run.strategy, "--device", gpu ? "cuda:0" : "cpu",
                                      "--devices", std::to_string(run.devices), "--json", job.estimate_path};
    if (run.master_weights) estimate.push_back("--master-weights");
    if (run.fp8_head) estimate.push_back("--fp8-head");  // the head's FP8 copies; scaling changes no memory
    append_batch_size(suite, run, estimate);
    // A failed estimate leaves the run without a prediction, not without its measurement.
    job.command = join_command({"mkdir", "-p", workload_folder(out, "estimates", run)}) + " && " +
                  join_command({"rm", "-f", job.estimate_path}) + "; " + join_command(estimate) + "; " + job.command;
  }
  return job;
}

}  // namespace ptrain::bench
