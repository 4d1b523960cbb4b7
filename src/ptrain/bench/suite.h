// A benchmark suite: the workload (the keys of a `ptrain train --config` file), or several named ones, and
// the list of ways to train it (precision, strategy, devices), each beside the PyTorch variants it asks for.
// Suites are YAML files people copy and edit; `standard` is configs/bench/standard.yaml, the classic
// comparison, and `speed` configs/bench/speed.yaml, ResNet-50 and GPT-2 small beside PyTorch eager and
// compiled. A suite may carry smaller workloads and run lists for machines without a GPU, so that the
// same command finishes in minutes there.
//
//   name: my-suite
//   workload: {model: resnet50, dataset: cifar10, image-size: 224, batch-size: 128, epochs: 5}
//   runs:
//     - {precision: fp32}                                   # one device, strategy single
//     - {precision: fp16, master-weights: true}
//     - {precision: amp-bf16, strategy: ddp, devices: all}  # every GPU --gpus allows
//     - {precision: amp-bf16, pytorch: [eager, compiled]}   # with --pytorch: PyTorch eager and torch.compile
//     - {precision: amp-bf16, pytorch: [compiled, compiled-default]}  # torch.compile in two modes
//     - {precision: amp-bf16, batch-size: 256}              # another batch: the run "amp-bf16-single-x1-b256"
//     - {precision: fp8, fp8-scaling: delayed, fp8-head: true, pytorch: none}  # "fp8-delayed-head-single-x1"
//   cpu-workload: {...}   # replaces workload without GPUs (optional)
//   cpu-runs: [...]       # replaces runs without GPUs (optional)
//   pytorch-compile-mode: reduce-overhead   # torch.compile's mode for `compiled` (optional; default: default)
//   warm-up: true      # a short untimed run per dtype before the first timed one (optional; default: false)
//   estimate: false    # no `ptrain estimate` before each run, as --no-estimate (optional; default: true)
//   accuracy: false    # short runs for speed and memory: the report says accuracy is left out (default: true)
//
// PyTorch variants: `eager`, `compiled` (torch.compile in the suite's pytorch-compile-mode) and
// `compiled-MODE` for torch.compile in another mode (compiled-default, compiled-reduce-overhead,
// compiled-max-autotune, compiled-max-autotune-no-cudagraphs): each is a job of its own, its records under
// runs/pytorch-compiled-MODE/ beside runs/pytorch-compiled/ (compiled-MODE naming the suite's own mode is
// `compiled`), so that one report shows PyTorch compiled in both modes.
//
// A run's batch-size (samples per device) replaces its workload's for that run, for a sweep over batch sizes:
// the run's id and label carry it ("amp-bf16-single-x1-b256"), and the workload's train-limit, where it has
// one, grows or shrinks with the batch so that the run keeps its number of steps (30 steps of 128 from 3,840
// images are 30 steps of 400 from 12,000).
//
// Several workloads: `workloads:` maps names to workloads and every run names its own; `cpu-workloads:`
// replaces them without GPUs. The same run may appear again for jobs an earlier entry did not ask for
// (`ptrain: false` leaves ptrain's out), so that a suite can order its most important jobs first.
//
//   workloads:
//     resnet50: {model: resnet50, dataset: cifar10, ...}
//     gpt2-small: {model: gpt-small, dataset: synthetic-tokens, ...}
//   runs:
//     - {workload: resnet50, precision: amp-bf16, pytorch: [eager, compiled]}
//     - {workload: gpt2-small, precision: fp32}
//     - {workload: gpt2-small, precision: fp32, ptrain: false, pytorch: compiled}
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ptrain/strategy_spec/strategy_spec.h"

namespace ptrain::bench {

// PyTorch variants a run can ask for beside ptrain's (with `ptrain bench --pytorch`): the classic eager
// comparison (bench/pytorch_reference.py as the workload says), and PyTorch at its best (torch.compile,
// channels-last for convolutional models, the fused optimizer).
inline constexpr char kPytorchEager[] = "eager";
inline constexpr char kPytorchCompiled[] = "compiled";
// "compiled-MODE": torch.compile in MODE rather than the suite's pytorch-compile-mode.
inline constexpr char kPytorchCompiledModePrefix[] = "compiled-";
// Whether a PyTorch variant goes through torch.compile (compiled, compiled-MODE).
bool is_compiled_variant(const std::string& variant);

struct SuiteRun {
  std::string workload;             // its workload's name in a suite of several; empty in a suite of one
  std::string precision = "fp32";
  bool master_weights = false;
  std::string strategy = strategies::StrategySpec().name();  // as --strategy names it; spec() tells what it does
  int64_t devices = 1;              // resolved: "all" becomes the devices the machine offers
  bool ptrain = true;               // trained by ptrain (false: an entry of the same run elsewhere is)
  std::vector<std::string> pytorch{kPytorchEager};  // PyTorch variants beside it, in order
  // Samples per device instead of the workload's batch-size (suite key batch-size on the run); empty: the
  // workload's. Suite::run_workload gives the workload the run trains.
  std::optional<int64_t> batch_size;
  // --precision fp8's own flags (suite keys fp8-scaling: delayed and fp8-head on an fp8 run; off: `ptrain
  // train`'s defaults, dynamic scaling and a bf16 head). They are the run's, not the workload's, because amp-bf16
  // runs of the same workload refuse them. PyTorch's reference has dynamic scaling and a bf16 head only.
  bool fp8_delayed_scaling = false;
  bool fp8_head = false;
  // Whether the run asks for fp8 flags other than `ptrain train`'s defaults (and PyTorch's recipe).
  bool fp8_beyond_defaults() const { return fp8_delayed_scaling || fp8_head; }
  // Fused paths ptrain leaves out (suite key skip-fusions: one name or a list; --skip-fusions): a ptrain-only run
  // that measures what those fusions bring beside the same run with all of them.
  std::vector<std::string> skip_fusions;

  // Unique within a suite's workload and safe as a file name, e.g. "fp16-master-single-x1", or
  // "amp-bf16-single-x1-b256" for a run with its own batch-size, "fp8-delayed-head-single-x1" with fp8 flags,
  // "amp-bf16-single-x1-no-stem-pool" with a fusion skipped.
  std::string run_id() const;
  // run_id(), prefixed by the workload in a suite of several: "resnet50/fp16-master-single-x1".
  std::string id() const;
  std::string label() const;  // for people, e.g. "fp16 + master weights, single, 1 GPU" (", batch 256",
                              // ", without stem-pool")
  // What the strategy does (one process a device? several devices from one?), asked instead of its name.
  strategies::StrategySpec spec() const { return strategies::StrategySpec::parse(strategy); }
};

// A workload as `ptrain train` keys and values, in file order (values as text, lists as YAML flow).
using WorkloadKeys = std::vector<std::pair<std::string, std::string>>;

struct Suite {
  std::string name;
  std::string source;  // the file it came from
  WorkloadKeys workload;  // a suite of one workload (`workload:`); empty in a suite of several
  std::vector<std::pair<std::string, WorkloadKeys>> workloads;  // a suite of several (`workloads:`), in file order
  std::vector<SuiteRun> runs;
  bool on_gpu = false;
  // torch.compile's mode for the compiled variant (suite key pytorch-compile-mode): "default", or
  // "reduce-overhead" (forward and backward replayed as CUDA graphs, as ptrain replays its step), and the
  // other modes of compile_modes(). Variants compiled-MODE name their own.
  std::string pytorch_compile_mode = "default";
  // Suite key warm-up: before the first timed run, the bench trains a few untimed steps per dtype (fp32, fp16,
  // bf16, ...), ptrain's and PyTorch eager's, so that the CUDA driver's compilation of the PTX kernels LibTorch
  // and cuDNN ship (15-25 s the first time a machine trains a half type, docs/results/2026-12-02-h200-all-modes.md)
  // is paid once, before the clocks start, and named in the bench's log and report.
  bool warm_up = false;
  // Suite key estimate: false leaves out `ptrain estimate` before each ptrain run (its two probe processes), as
  // --no-estimate does.
  bool estimate = true;
  // Suite key accuracy: false for a suite of short runs that measure throughput, memory and utilisation only:
  // the report says that accuracy is left out, and how to get it.
  bool accuracy = true;

  bool has_several_workloads() const { return !workloads.empty(); }
  // The run's workload keys; throws ptrain::Error for a workload the suite does not have.
  const WorkloadKeys& workload_of(const SuiteRun& run) const;
  // The workload the run trains: workload_of(run) with the run's own batch-size, and train-limit scaled with
  // it. Throws ptrain::Error naming the suite file and the run where the two cannot be combined (a workload
  // of global-batch-size, a batch-size or train-limit that is not a number).
  WorkloadKeys run_workload(const SuiteRun& run) const;
  // torch.compile's mode of a compiled variant: pytorch_compile_mode for compiled, MODE for compiled-MODE.
  std::string compile_mode_of(const std::string& variant) const;
};

// The torch.compile modes a suite's pytorch-compile-mode may name.
const std::vector<std::string>& compile_modes();

// Resolves "standard" (or any name without a path separator or .yaml suffix) to configs/bench/NAME.yaml
// under source_dir; anything else is a file. available_gpus = 0 picks the cpu-workload(s) / cpu-runs when
// the suite has them; "devices: all" becomes available_gpus (on the CPU: 2 processes or replicas).
// Throws ptrain::Error naming the file and the key for unknown keys, bad values and jobs asked twice.
Suite load_suite(const std::string& name_or_path, const std::string& source_dir, int64_t available_gpus);

// Sets each KEY=VALUE of overrides in the suite's workload (replacing the file's value, or adding the key),
// under the rules of the file's own workload keys; in a suite of several, KEY sets every workload and
// NAME/KEY the one named. Throws ptrain::Error naming the --set that breaks them.
void apply_overrides(Suite& suite, const std::vector<std::pair<std::string, std::string>>& overrides);

// Parses "--set KEY=VALUE" text; throws ptrain::Error naming it when there is no '=' or no key.
std::pair<std::string, std::string> parse_override(const std::string& text);

}  // namespace ptrain::bench
