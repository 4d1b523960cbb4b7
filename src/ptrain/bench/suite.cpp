#include "ptrain/bench/suite.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "ptrain/core/error.h"

namespace ptrain::bench {

namespace {

// Without GPUs, "all" means two CPU processes (ddp over gloo) or two CPU replicas (dp): enough to show
// the strategy working, cheap enough for two cores.
constexpr int64_t kCpuDevicesForAll = 2;

std::string scalar_text(const YAML::Node& node, const std::string& where) {
  if (node.IsScalar()) return node.as<std::string>();
  if (node.IsSequence()) {
    std::string text;
    for (const auto& item : node) {
      check(item.IsScalar(), where + ": a list of plain values is expected");
      text += (text.empty() ? "" : ",") + item.as<std::string>();
    }
    return text;
  }
  throw Error(where + ": expected a value or a list of values");
}

// The workload key as `ptrain train` spells it; throws when the key belongs to each run, or to the bench
// itself: a workload that set it would fight the runs.
std::string workload_key(const std::string& key, const std::string& where) {
  static const std::set<std::string> per_run{"precision",   "master-weights", "strategy", "replicas",
                                             "device",      "metrics-out",    "resume",   "checkpoint-dir",
                                             "dry-run",     "config"};
  std::string normalised = key;
  for (auto& c : normalised) c = c == '_' ? '-' : c;
  check(per_run.count(normalised) == 0,
        where + ": key '" + key + "' is set per run (or by the bench) and cannot be part of the workload");
  return normalised;
}

std::vector<std::pair<std::string, std::string>> read_workload(const YAML::Node& node, const std::string& where) {
  check(node.IsMap(), where + ": expected a mapping of `ptrain train` keys to values");
  std::vector<std::pair<std::string, std::string>> workload;
  for (const auto& entry : node) {
    const std::string key = entry.first.as<std::string>();
    workload.emplace_back(workload_key(key, where), scalar_text(entry.second, where + ": key '" + key + "'"));
  }
  return workload;
}

bool read_bool(const YAML::Node& node, const std::string& where) {
  const std::string text = node.as<std::string>();
  if (text == "true" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "no" || text == "off") return false;
  throw Error(where + ": '" + text + "' is not true or false");
}

std::vector<SuiteRun> read_runs(const YAML::Node& node, const std::string& where, int64_t available_gpus) {
  check(node.IsSequence() && node.size() > 0, where + ": expected a non-empty list of runs");
  std::vector<SuiteRun> runs;
  std::set<std::string> ids;
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    const YAML::Node& entry = node[i];
    check(entry.IsMap(), at + ": expected a mapping such as {precision: amp-bf16, strategy: ddp, devices: all}");
    SuiteRun run;
    bool devices_given = false;
    for (const auto& kv : entry) {
      const std::string key = kv.first.as<std::string>();
      const std::string key_at = at + ": key '" + key + "'";
      check(kv.second.IsScalar(), key_at + ": expected a single value");
      const std::string value = kv.second.as<std::string>();
      if (key == "precision") {
        run.precision = value;
      } else if (key == "master-weights" || key == "master_weights") {
        run.master_weights = read_bool(kv.second, key_at);
      } else if (key == "strategy") {
        check(value == "single" || value == "dp" || value == "ddp" || value == "zero1" || value == "zero2" ||
                  value == "zero3" || value == "fsdp",
              key_at + ": unknown strategy '" + value + "' (known: single, dp, ddp, zero1, zero2, zero3, fsdp)");
        run.strategy = value;
      } else if (key == "devices") {
        devices_given = true;
        if (value == "all") {
          run.devices = available_gpus > 0 ? available_gpus : kCpuDevicesForAll;
        } else {
          try {
            size_t used = 0;
            run.devices = std::stoll(value, &used);
            check(used == value.size(), "");
          } catch (const std::exception&) {
            throw Error(key_at + ": '" + value + "' is neither a number nor all");
          }
          check(run.devices > 0, key_at + ": must be positive");
          check(available_gpus == 0 || run.devices <= available_gpus,
                key_at + ": " + value + " devices, but only " + std::to_string(available_gpus) + " GPU(s) are available");
        }
      } else {
        throw Error(key_at + " is not a run key (known: precision, master-weights, strategy, devices)");
      }
    }
    check(run.strategy != "single" || !devices_given || run.devices == 1,
          at + ": strategy single runs on one device; use dp or ddp for more");
    check(ids.insert(run.id()).second, at + ": the same run as an earlier one (" + run.label() + ")");
    runs.push_back(run);
  }
  return runs;
}

}  // namespace

std::string SuiteRun::id() const {
  return precision + (master_weights ? "-master" : "") + "-" + strategy + "-x" + std::to_string(devices);
}

std::string SuiteRun::label() const {
  return precision + (master_weights ? " + master weights" : "") + ", " + strategy + ", " + std::to_string(devices) +
         (devices == 1 ? " device" : " devices");
}

Suite load_suite(const std::string& name_or_path, const std::string& source_dir, int64_t available_gpus) {
  const bool is_name = name_or_path.find('/') == std::string::npos &&
                       name_or_path.size() > 0 &&
                       name_or_path.rfind(".yaml") != name_or_path.size() - 5 &&
                       name_or_path.rfind(".yml") != name_or_path.size() - 4;
  const std::string path = is_name ? source_dir + "/configs/bench/" + name_or_path + ".yaml" : name_or_path;
  if (!std::filesystem::is_regular_file(path)) {
    throw Error("--suite " + name_or_path + ": no such suite file: " + path);
  }
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    throw Error(path + ": not valid YAML: " + e.what());
  }
  check(root.IsMap(), path + ": a suite is a mapping with the keys name, workload and runs");
  for (const auto& entry : root) {
    const std::string key = entry.first.as<std::string>();
    static const std::set<std::string> known{"name", "workload", "runs", "cpu-workload", "cpu-runs"};
    check(known.count(key) == 1, path + ": key '" + key + "' is not a suite key (known: name, workload, runs, "
                                        "cpu-workload, cpu-runs)");
  }
  check(root["workload"].IsDefined(), path + ": the key 'workload' is missing");
  check(root["runs"].IsDefined(), path + ": the key 'runs' is missing");

  Suite suite;
  suite.source = path;
  suite.name = root["name"].IsDefined() ? root["name"].as<std::string>()
                                         : std::filesystem::path(path).stem().string();
  suite.on_gpu = available_gpus > 0;
  const bool cpu_variant = !suite.on_gpu;
  const char* workload_key = cpu_variant && root["cpu-workload"].IsDefined() ? "cpu-workload" : "workload";
  const char* runs_key = cpu_variant && root["cpu-runs"].IsDefined() ? "cpu-runs" : "runs";
  suite.workload = read_workload(root[workload_key], path + ": " + workload_key);
  suite.runs = read_runs(root[runs_key], path + ": " + runs_key, available_gpus);
  return suite;
}

std::pair<std::string, std::string> parse_override(const std::string& text) {
  const auto eq = text.find('=');
  check(eq != std::string::npos && eq > 0 && eq + 1 < text.size(),
        "--set " + text + ": expected KEY=VALUE, a `ptrain train` key such as max-steps=60");
  return {text.substr(0, eq), text.substr(eq + 1)};
}

void apply_overrides(Suite& suite, const std::vector<std::pair<std::string, std::string>>& overrides) {
  for (const auto& [given_key, value] : overrides) {
    const std::string key = workload_key(given_key, "--set " + given_key + "=" + value);
    auto at = std::find_if(suite.workload.begin(), suite.workload.end(), [&](const auto& kv) { return kv.first == key; });
    if (at == suite.workload.end()) {
      suite.workload.emplace_back(key, value);
    } else {
      at->second = value;
    }
  }
}

}  // namespace ptrain::bench
