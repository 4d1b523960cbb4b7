#include "ptrain/bench/bench_record.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ptrain/bench/jobs.h"
#include "ptrain/config/cli_options.h"
#include "ptrain/config/train_config.h"
#include "ptrain/core/error.h"
#include "ptrain/io/atomic_file.h"
#include "ptrain/metrics/environment.h"
#include "ptrain/report/report_table.h"

namespace ptrain::bench {

namespace fs = std::filesystem;

namespace {

void write_workload_file(const Suite& suite, const std::string& name, const WorkloadKeys& workload,
                         const std::string& path) {
  fs::create_directories(fs::path(path).parent_path());
  io::write_file_atomically(path, [&](std::ostream& out) {
    out << "# The workload " << (name.empty() ? "" : "'" + name + "' ") << "of suite '" << suite.name << "' ("
        << suite.source << "), as ptrain bench ran it.\n";
    for (const auto& [key, value] : workload) {
      out << key << ": " << (value.find(',') != std::string::npos ? "[" + value + "]" : value) << "\n";
    }
  });
}

void check_workload_trains(const std::string& workload_file) {
  config::TrainConfig config;
  CLI::App app;
  config::add_train_options(app, config);
  app.parse(std::vector<std::string>{});
  config::apply_yaml_config(app, workload_file);
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

}  // namespace

void write_workload_files(const Suite& suite, const std::string& out) {
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
}

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

void write_bench_record(const Suite& suite, const BenchOptions& o, const std::vector<BenchJob>& jobs,
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
  j["repeat"] = o.repeat;
  j["commands"] = nlohmann::json::array();
  for (const auto& job : jobs) {
    j["commands"].push_back({{"framework", job.framework}, {"run", job.run.id()}, {"command", job.command},
                             {"unavailable", job.unavailable}});
    if (!job.compile_mode.empty()) j["commands"].back()["compile_mode"] = job.compile_mode;
  }
  io::write_file_atomically(path, j.dump(2) + "\n");
}


std::optional<metrics::RunRecord> finished_record(const BenchJob& job) {
  if (!fs::is_regular_file(job.metrics_path)) return std::nullopt;
  metrics::RunRecord record;
  try {
    std::ifstream in(job.metrics_path);
    record = metrics::run_record_from_json(nlohmann::json::parse(in));
  } catch (const std::exception&) {
    return std::nullopt;  // half a file from an interrupted run: run it again
  }
  // Compiled in another mode (the suite's pytorch-compile-mode changed since): not this job's record.
  if (!job.compile_mode.empty() && report::compile_mode_of(record) != job.compile_mode) return std::nullopt;
  return record;
}


std::vector<double> load_average() {
  std::ifstream in("/proc/loadavg");
  std::vector<double> load(3);
  if (!(in >> load[0] >> load[1] >> load[2])) return {};
  return load;
}

void attach_bench_context(const BenchJob& job, const std::vector<double>& load_before,
                          const std::vector<double>& load_after) {
  try {
    std::ifstream in(job.metrics_path);
    metrics::RunRecord record = metrics::run_record_from_json(nlohmann::json::parse(in));
    const auto load = [](const std::vector<double>& l) { return l.empty() ? nlohmann::json(nullptr) : nlohmann::json(l); };
    record.extra["bench"] = {{"repeat", job.repeat},
                             {"load_average_before", load(load_before)},
                             {"load_average_after", load(load_after)},
                             {"cores", static_cast<int64_t>(std::thread::hardware_concurrency())}};
    metrics::write_run_record(job.metrics_path, record);
  } catch (const std::exception&) {
    // The context explains a figure; the run's own record stands without it.
  }
}

void attach_estimate(const BenchJob& job) {
  if (job.estimate_path.empty() || !fs::is_regular_file(job.estimate_path)) return;
  try {
    std::ifstream in(job.estimate_path);
    const auto estimate = nlohmann::json::parse(in);
    std::ifstream record_in(job.metrics_path);
    metrics::RunRecord record = metrics::run_record_from_json(nlohmann::json::parse(record_in));
    for (const auto& row : estimate.at("strategies")) {
      // Rows are labelled by strategy name, and some by more than a name ("zero3+offload").
      if (row.at("strategy") != job.run.spec().name()) continue;
      record.extra["estimate"] = {{"strategy", row.at("strategy")},
                                  {"devices", row.at("devices")},
                                  {"predicted_peak_allocated_bytes", row.at("predicted_peak_allocated_bytes")},
                                  {"bytes_per_sample", estimate.at("bytes_per_sample")},
                                  {"fixed_bytes", estimate.at("fixed_bytes")},
                                  {"update_bytes", estimate.at("update_bytes")},
                                  {"probes", estimate.at("probes")}};
      metrics::write_run_record(job.metrics_path, record);
      return;
    }
  } catch (const std::exception&) {
    // The prediction is an addition: a run's own record stands without it.
  }
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
  if (const auto diverged = report::table::divergence_text(r)) s += ", " + *diverged;
  if (r.peak_allocated_bytes) {
    std::snprintf(text, sizeof(text), ", peak %.2f GiB per GPU", static_cast<double>(*r.peak_allocated_bytes) / (1 << 30));
    s += text;
  }
  return s;
}


}  // namespace ptrain::bench
