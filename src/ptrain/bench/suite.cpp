#include "ptrain/bench/suite.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <filesystem>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "ptrain/config/train_config.h"
#include "ptrain/core/error.h"
#include "ptrain/core/text.h"
#include "ptrain/models/model.h"
#include "ptrain/precision/policy.h"
#include "ptrain/train/plan.h"

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

// text as a whole number (all of it), or none.
std::optional<int64_t> whole_number(const std::string& text) {
  try {
    size_t used = 0;
    const int64_t value = std::stoll(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// Throws ptrain::Error "<what> is not a torch.compile mode (default, ...)" unless mode is one.
void check_compile_mode(const std::string& mode, const std::string& what) {
  const auto& modes = compile_modes();
  std::string names;
  for (const auto& m : modes) names += (names.empty() ? "" : ", ") + m;
  check(std::find(modes.begin(), modes.end(), mode) != modes.end(),
        what + " is not a torch.compile mode (" + names + ")");
}

// eager, compiled, compiled-MODE; compiled-MODE of the suite's own mode is compiled (one job, one folder).
std::vector<std::string> read_pytorch_variants(const YAML::Node& node, const std::string& where,
                                               const std::string& suite_compile_mode) {
  std::vector<std::string> variants;
  const auto add = [&](const YAML::Node& item) {
    check(item.IsScalar(), where + ": expected eager, compiled, compiled-MODE, a list of them, or none");
    std::string v = item.as<std::string>();
    if (v == "none" && node.IsScalar()) return;
    if (v.rfind(kPytorchCompiledModePrefix, 0) == 0) {
      const std::string mode = v.substr(std::string(kPytorchCompiledModePrefix).size());
      check_compile_mode(mode, where + ": '" + v + "': '" + mode + "'");
      if (mode == suite_compile_mode) v = kPytorchCompiled;
    } else {
      check(v == kPytorchEager || v == kPytorchCompiled,
            where + ": unknown PyTorch variant '" + v +
                "' (known: eager, compiled, compiled-MODE such as compiled-default; none for ptrain alone)");
    }
    check(std::find(variants.begin(), variants.end(), v) == variants.end(),
          where + ": '" + v + "' twice" +
              (v == kPytorchCompiled ? " (compiled runs the suite's pytorch-compile-mode, " + suite_compile_mode + ")"
                                     : std::string()));
    variants.push_back(v);
  };
  if (node.IsSequence()) {
    for (const auto& item : node) add(item);
  } else {
    add(node);
  }
  return variants;
}

// A run's batch-size: a positive whole number.
int64_t read_batch_size(const std::string& value, const std::string& where) {
  const auto batch = whole_number(value);
  check(batch && *batch > 0, where + ": '" + value + "' is not a positive whole number of samples per device");
  return *batch;
}

// Workload names prefix run ids ("resnet50/fp32-single-x1"), and run ids follow a framework in --skip
// ("pytorch/resnet50/fp32-single-x1"): a name must be plain and must not read as a framework.
void check_workload_name(const std::string& name, const std::string& where) {
  const bool plain = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  }) && name.front() != '.';
  check(plain, where + ": workload name '" + name + "' must be letters, digits, '-', '_' or '.'");
  check(name != "ptrain" && name != "pytorch" && name.rfind("pytorch-compiled", 0) != 0,
        where + ": workload name '" + name + "' reads as a framework in --skip; choose another");
}

// skip-fusions: a fusion's name, a comma-separated text of them or a list, each one of models::fusion_names() once;
// kept in that order, so that one set of fusions is one run id however it is written.
std::vector<std::string> read_fusions(const YAML::Node& node, const std::string& where) {
  std::vector<std::string> names;
  const auto add = [&](const std::string& text) {
    std::stringstream parts(text);
    for (std::string name; std::getline(parts, name, ',');) names.push_back(name);
  };
  if (node.IsScalar()) {
    add(node.as<std::string>());
  } else {
    check(node.IsSequence() && node.size() > 0, where + ": expected a fusion's name or a list of them");
    for (const auto& item : node) {
      check(item.IsScalar(), where + ": expected a fusion's name or a list of them");
      add(item.as<std::string>());
    }
  }
  train::check_fusion_names(names, where);
  std::vector<std::string> ordered;
  for (const auto& name : models::fusion_names())
    if (std::find(names.begin(), names.end(), name) != names.end()) ordered.push_back(name);
  return ordered;
}

std::vector<SuiteRun> read_runs(const YAML::Node& node, const std::string& where, int64_t available_gpus,
                                const std::vector<std::string>& workload_names, const std::string& compile_mode) {
  check(node.IsSequence() && node.size() > 0, where + ": expected a non-empty list of runs");
  std::vector<SuiteRun> runs;
  std::map<std::string, size_t> asked;  // "framework/id" -> the entry that asked for it
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    const YAML::Node& entry = node[i];
    check(entry.IsMap(), at + ": expected a mapping such as {precision: amp-bf16, strategy: ddp, devices: all}");
    SuiteRun run;
    bool devices_given = false;
    bool fp8_keys_given = false;  // fp8-scaling or fp8-head, whatever their values
    for (const auto& kv : entry) {
      const std::string key = kv.first.as<std::string>();
      const std::string key_at = at + ": key '" + key + "'";
      if (key == "pytorch") {
        run.pytorch = read_pytorch_variants(kv.second, key_at, compile_mode);
        continue;
      }
      if (key == "skip-fusions" || key == "skip_fusions") {
        run.skip_fusions = read_fusions(kv.second, key_at);
        continue;
      }
      check(kv.second.IsScalar(), key_at + ": expected a single value");
      const std::string value = kv.second.as<std::string>();
      if (key == "precision") {
        run.precision = value;
      } else if (key == "master-weights" || key == "master_weights") {
        run.master_weights = read_bool(kv.second, key_at);
      } else if (key == "ptrain") {
        run.ptrain = read_bool(kv.second, key_at);
      } else if (key == "batch-size" || key == "batch_size") {
        run.batch_size = read_batch_size(value, key_at);
      } else if (key == "workload") {
        check(!workload_names.empty(),
              key_at + ": this suite has one workload (`workload:`); name workloads under `workloads:` to choose");
        check(std::find(workload_names.begin(), workload_names.end(), value) != workload_names.end(),
              key_at + ": no workload '" + value + "' in this suite (workloads: " + [&] {
                std::string list;
                for (const auto& n : workload_names) list += (list.empty() ? "" : ", ") + n;
                return list;
              }() + ")");
        run.workload = value;
      } else if (key == "strategy") {
        const auto& known = strategies::StrategySpec::names();
        check(std::find(known.begin(), known.end(), value) != known.end(),
              key_at + ": unknown strategy '" + value + "' (known: " + strategies::StrategySpec::known_names() + ")");
        run.strategy = value;
      } else if (key == "fp8-scaling" || key == "fp8_scaling") {
        check(value == "dynamic" || value == "delayed", key_at + ": '" + value + "' is neither dynamic nor delayed");
        run.fp8_delayed_scaling = value == "delayed";
        fp8_keys_given = true;
      } else if (key == "fp8-head" || key == "fp8_head") {
        run.fp8_head = read_bool(kv.second, key_at);
        fp8_keys_given = true;
      } else if (key == "devices") {
        devices_given = true;
        if (value == "all") {
          run.devices = available_gpus > 0 ? available_gpus : kCpuDevicesForAll;
        } else {
          const auto devices = whole_number(value);
          check(devices.has_value(), key_at + ": '" + value + "' is neither a number nor all");
          run.devices = *devices;
          check(run.devices > 0, key_at + ": must be positive");
          check(available_gpus == 0 || run.devices <= available_gpus,
                key_at + ": " + value + " devices, but only " + std::to_string(available_gpus) + " GPU(s) are available");
        }
      } else {
        throw Error(key_at + " is not a run key (known: precision, master-weights, strategy, devices, workload, "
                             "batch-size, fp8-scaling, fp8-head, skip-fusions, ptrain, pytorch)");
      }
    }
    check(!fp8_keys_given || precision::precision_mode_or_none(run.precision) == precision::PrecisionMode::FP8,
          at + ": fp8-scaling and fp8-head belong to precision fp8, not " + run.precision);
    check(run.skip_fusions.empty() || run.pytorch.empty(),
          at + ": skip-fusions is ptrain's alone (PyTorch has no such fusions); give the run pytorch: none and ask "
               "for PyTorch beside the run with all of them");
    check(workload_names.empty() || !run.workload.empty(),
          at + ": this suite has several workloads; say which one the run trains (workload: NAME)");
    const strategies::StrategySpec spec = run.spec();
    check(spec.multi_process() || spec.drives_several_devices() || !devices_given || run.devices == 1,
          at + ": strategy single runs on one device; use dp or ddp for more");
    check(run.ptrain || !run.pytorch.empty(), at + ": runs nothing (ptrain: false and no PyTorch variant)");
    std::vector<std::string> jobs;
    if (run.ptrain) jobs.push_back("ptrain");
    for (const auto& variant : run.pytorch) jobs.push_back("pytorch " + variant);
    for (const auto& job : jobs) {
      const auto earlier = asked.find(job + "/" + run.id());
      check(earlier == asked.end(), at + ": the same run as an earlier one (" + run.label() + ", its " + job +
                                        " job is asked by " + where + "[" +
                                        std::to_string(earlier == asked.end() ? 0 : earlier->second) + "])");
      asked[job + "/" + run.id()] = i;
    }
    runs.push_back(run);
  }
  return runs;
}

}  // namespace

std::string SuiteRun::run_id() const {
  std::string skipped;
  for (const auto& fusion : skip_fusions) skipped += "-no-" + fusion;
  return precision + (master_weights ? "-master" : "") + (fp8_delayed_scaling ? "-delayed" : "") +
         (fp8_head ? "-head" : "") + "-" + strategy + "-x" + std::to_string(devices) +
         (batch_size ? "-b" + std::to_string(*batch_size) : "") + skipped;
}

std::string SuiteRun::id() const { return workload.empty() ? run_id() : workload + "/" + run_id(); }

std::string SuiteRun::label() const {
  return (workload.empty() ? "" : workload + " ") + precision + (master_weights ? " + master weights" : "") +
         (fp8_delayed_scaling ? " (delayed scaling)" : "") + (fp8_head ? " + FP8 head" : "") + ", " +
         strategy + ", " + std::to_string(devices) + (devices == 1 ? " device" : " devices") +
         (batch_size ? ", batch " + std::to_string(*batch_size) : "") +
         (skip_fusions.empty() ? "" : ", without " + join(skip_fusions, ", "));
}

bool is_compiled_variant(const std::string& variant) {
  return variant == kPytorchCompiled || variant.rfind(kPytorchCompiledModePrefix, 0) == 0;
}

std::string Suite::compile_mode_of(const std::string& variant) const {
  if (variant == kPytorchCompiled) return pytorch_compile_mode;
  if (variant.rfind(kPytorchCompiledModePrefix, 0) == 0) {
    return variant.substr(std::string(kPytorchCompiledModePrefix).size());
  }
  return "";
}

WorkloadKeys Suite::run_workload(const SuiteRun& run) const {
  WorkloadKeys keys = workload_of(run);
  if (!run.batch_size) return keys;
  const std::string where = source + ": run " + run.id() + " (batch-size " + std::to_string(*run.batch_size) + ")";
  const auto at = [&](const std::string& key) {
    return std::find_if(keys.begin(), keys.end(), [&](const auto& kv) { return kv.first == key; });
  };
  check(at("global-batch-size") == keys.end(),
        where + ": its workload sets global-batch-size, which a run's batch-size would contradict");
  const auto number = [&](const std::string& key, const std::string& text) {
    const auto value = whole_number(text);
    check(value.has_value(), where + ": the workload's " + key + " '" + text + "' is not a whole number");
    return *value;
  };
  const auto batch = at("batch-size");
  const int64_t workload_batch =
      batch == keys.end() ? config::TrainConfig{}.run.batch_size : number("batch-size", batch->second);
  check(workload_batch > 0, where + ": the workload's batch-size is not positive");
  const auto limit = at("train-limit");
  if (limit != keys.end()) {
    const int64_t samples = number("train-limit", limit->second);
    // 0 trains on every sample; a limit keeps the run's steps an epoch: rounded up, never a step fewer.
    if (samples > 0) limit->second = std::to_string((samples * *run.batch_size + workload_batch - 1) / workload_batch);
  }
  if (batch == keys.end()) {
    keys.emplace_back("batch-size", std::to_string(*run.batch_size));
  } else {
    batch->second = std::to_string(*run.batch_size);
  }
  return keys;
}

const WorkloadKeys& Suite::workload_of(const SuiteRun& run) const {
  if (run.workload.empty()) return workload;
  for (const auto& [name, keys] : workloads) {
    if (name == run.workload) return keys;
  }
  throw Error(source + ": run " + run.id() + " names workload '" + run.workload + "', which the suite does not have");
}

Suite load_suite(const std::string& name_or_path, const std::string& source_dir, int64_t available_gpus) {
  const bool is_name = !name_or_path.empty() && name_or_path.find('/') == std::string::npos &&
                       !ends_with(name_or_path, ".yaml") && !ends_with(name_or_path, ".yml");
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
  check(root.IsMap(), path + ": a suite is a mapping with the keys name, workload (or workloads) and runs");
  for (const auto& entry : root) {
    const std::string key = entry.first.as<std::string>();
    static const std::set<std::string> known{"name",     "workload",      "workloads", "runs",
                                             "cpu-workload", "cpu-workloads", "cpu-runs",  "pytorch-compile-mode",
                                             "warm-up",  "estimate",      "accuracy"};
    check(known.count(key) == 1, path + ": key '" + key + "' is not a suite key (known: name, workload, workloads, "
                                        "runs, cpu-workload, cpu-workloads, cpu-runs, pytorch-compile-mode, warm-up, "
                                        "estimate, accuracy)");
  }
  const bool several = root["workloads"].IsDefined();
  check(!(several && root["workload"].IsDefined()),
        path + ": a suite has one workload (`workload:`) or several (`workloads:`), not both");
  check(!(several && root["cpu-workload"].IsDefined()),
        path + ": the key 'cpu-workload' belongs to a suite of one workload; this one has `workloads:`, so give "
               "`cpu-workloads:`");
  check(several || !root["cpu-workloads"].IsDefined(),
        path + ": the key 'cpu-workloads' belongs to a suite of several workloads (`workloads:`)");
  check(several || root["workload"].IsDefined(), path + ": the key 'workload' is missing");
  check(root["runs"].IsDefined(), path + ": the key 'runs' is missing");

  Suite suite;
  suite.source = path;
  suite.name = root["name"].IsDefined() ? root["name"].as<std::string>()
                                         : std::filesystem::path(path).stem().string();
  suite.on_gpu = available_gpus > 0;
  if (root["pytorch-compile-mode"].IsDefined()) {
    const auto& node = root["pytorch-compile-mode"];
    const std::string mode = node.IsScalar() ? node.as<std::string>() : "";
    check_compile_mode(mode, path + ": pytorch-compile-mode '" + mode + "'");
    suite.pytorch_compile_mode = mode;
  }
  for (const auto& [key, flag] : {std::pair<const char*, bool*>{"warm-up", &suite.warm_up},
                                  std::pair<const char*, bool*>{"estimate", &suite.estimate},
                                  std::pair<const char*, bool*>{"accuracy", &suite.accuracy}}) {
    if (!root[key].IsDefined()) continue;
    check(root[key].IsScalar(), path + ": " + key + ": expected true or false");
    *flag = read_bool(root[key], path + ": " + key);
  }
  const bool cpu_variant = !suite.on_gpu;
  const char* runs_key = cpu_variant && root["cpu-runs"].IsDefined() ? "cpu-runs" : "runs";
  std::vector<std::string> workload_names;
  if (several) {
    const char* key = cpu_variant && root["cpu-workloads"].IsDefined() ? "cpu-workloads" : "workloads";
    const YAML::Node& node = root[key];
    check(node.IsMap() && node.size() > 0, path + ": " + key + ": expected a mapping of names to workloads");
    for (const auto& entry : node) {
      const std::string name = entry.first.as<std::string>();
      const std::string where = path + ": " + key + ": " + name;
      check_workload_name(name, path + ": " + key);
      suite.workloads.emplace_back(name, read_workload(entry.second, where));
      workload_names.push_back(name);
    }
  } else {
    const char* key = cpu_variant && root["cpu-workload"].IsDefined() ? "cpu-workload" : "workload";
    suite.workload = read_workload(root[key], path + ": " + key);
  }
  suite.runs = read_runs(root[runs_key], path + ": " + runs_key, available_gpus, workload_names,
                         suite.pytorch_compile_mode);
  for (const auto& run : suite.runs) {
    suite.run_workload(run);  // a batch-size its workload cannot take, named now
    if (!run.batch_size) continue;
    const WorkloadKeys& own = suite.workload_of(run);
    const auto batch = std::find_if(own.begin(), own.end(), [](const auto& kv) { return kv.first == "batch-size"; });
    const std::string own_batch =
        batch == own.end() ? std::to_string(config::TrainConfig{}.run.batch_size) : batch->second;
    check(own_batch != std::to_string(*run.batch_size),
          path + ": " + runs_key + ": run " + run.id() + ": batch-size " + own_batch +
              " is its workload's own; leave it out (the run without it trains the same)");
  }
  return suite;
}

const std::vector<std::string>& compile_modes() {
  static const std::vector<std::string> modes{"default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"};
  return modes;
}

std::pair<std::string, std::string> parse_override(const std::string& text) {
  const auto eq = text.find('=');
  check(eq != std::string::npos && eq > 0 && eq + 1 < text.size(),
        "--set " + text + ": expected KEY=VALUE, a `ptrain train` key such as max-steps=60");
  return {text.substr(0, eq), text.substr(eq + 1)};
}

namespace {

void set_key(WorkloadKeys& workload, const std::string& key, const std::string& value) {
  auto at = std::find_if(workload.begin(), workload.end(), [&](const auto& kv) { return kv.first == key; });
  if (at == workload.end()) {
    workload.emplace_back(key, value);
  } else {
    at->second = value;
  }
}

}  // namespace

void apply_overrides(Suite& suite, const std::vector<std::pair<std::string, std::string>>& overrides) {
  for (const auto& [given_key, value] : overrides) {
    const std::string where = "--set " + given_key + "=" + value;
    const auto slash = given_key.find('/');
    const std::string target = slash == std::string::npos ? "" : given_key.substr(0, slash);
    const std::string key = workload_key(slash == std::string::npos ? given_key : given_key.substr(slash + 1), where);
    if (!suite.has_several_workloads()) {
      check(target.empty(), where + ": suite " + suite.name + " has one workload; set the key without '" + target +
                                "/'");
      set_key(suite.workload, key, value);
      continue;
    }
    bool found = false;
    std::string names;
    for (auto& [name, workload] : suite.workloads) {
      names += (names.empty() ? "" : ", ") + name;
      if (!target.empty() && name != target) continue;
      set_key(workload, key, value);
      found = true;
    }
    check(found, where + ": no workload '" + target + "' in suite " + suite.name + " (workloads: " + names + ")");
  }
}

}  // namespace ptrain::bench
