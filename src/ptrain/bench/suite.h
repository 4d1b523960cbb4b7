// A benchmark suite: one workload (the keys of a `ptrain train --config` file) and the list of ways to
// train it (precision, strategy, devices). Suites are YAML files people copy and edit; `standard` is
// configs/bench/standard.yaml, the classic comparison. A suite may carry a smaller workload and run
// list for machines without a GPU, so that the same command finishes in minutes there.
//
//   name: my-suite
//   workload: {model: resnet50, dataset: cifar10, image-size: 224, batch-size: 128, epochs: 5}
//   runs:
//     - {precision: fp32}                                   # one device, strategy single
//     - {precision: fp16, master-weights: true}
//     - {precision: amp-bf16, strategy: ddp, devices: all}  # every GPU --gpus allows
//   cpu-workload: {...}   # replaces workload without GPUs (optional)
//   cpu-runs: [...]       # replaces runs without GPUs (optional)
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ptrain::bench {

struct SuiteRun {
  std::string precision = "fp32";
  bool master_weights = false;
  std::string strategy = "single";  // single | dp | ddp
  int64_t devices = 1;              // resolved: "all" becomes the devices the machine offers

  // Unique within a suite and safe as a file name, e.g. "fp16-master-single-x1".
  std::string id() const;
  std::string label() const;  // for people, e.g. "fp16 + master weights, single, 1 GPU"
};

struct Suite {
  std::string name;
  std::string source;  // the file it came from
  // The workload as `ptrain train` keys and values, in file order (values as text, lists as YAML flow).
  std::vector<std::pair<std::string, std::string>> workload;
  std::vector<SuiteRun> runs;
  bool on_gpu = false;
};

// Resolves "standard" (or any name without a path separator or .yaml suffix) to configs/bench/NAME.yaml
// under source_dir; anything else is a file. available_gpus = 0 picks the cpu-workload / cpu-runs when
// the suite has them; "devices: all" becomes available_gpus (on the CPU: 2 processes or replicas).
// Throws ptrain::Error naming the file and the key for unknown keys, bad values and duplicate runs.
Suite load_suite(const std::string& name_or_path, const std::string& source_dir, int64_t available_gpus);

// Sets each KEY=VALUE of overrides in the suite's workload (replacing the file's value, or adding the key),
// under the rules of the file's own workload keys. Throws ptrain::Error naming the --set that breaks them.
void apply_overrides(Suite& suite, const std::vector<std::pair<std::string, std::string>>& overrides);

// Parses "--set KEY=VALUE" text; throws ptrain::Error naming it when there is no '=' or no key.
std::pair<std::string, std::string> parse_override(const std::string& text);

}  // namespace ptrain::bench
