// PyTorch's jobs: bench/pytorch_reference.py on the same workload, eager (the classic comparison) or
// compiled (PyTorch at its best, in the torch.compile mode the variant names), under torchrun for the
// strategies of one process a device; where PyTorch has no counterpart of the run, the job is unavailable
// with the reason.
#include <array>
#include <cstdio>
#include <map>
#include <sstream>

#include "ptrain/bench/jobs.h"
#include "ptrain/config/train_config.h"
#include "ptrain/metrics/run_record.h"
#include "ptrain/models/torchscript_model.h"
#include "ptrain/models/zoo.h"

namespace ptrain::bench {

namespace {


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

// "single, ddp and zero1": the strategies whose reference runs torch.compile can compile.
std::string compiled_strategies() {
  std::vector<std::string> names;
  for (const auto& spec : strategies::StrategySpec::all())
    if (strategies::descriptor(spec).pytorch_compiles) names.push_back(spec.name());
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) text += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return text;
}

}  // namespace

BenchJob pytorch_job(const Suite& suite, const SuiteRun& run, const std::string& variant, const BenchOptions& o,
                     const std::string& out, const PytorchAbilities& abilities, int64_t repeat) {
  const bool compiled = is_compiled_variant(variant);
  BenchJob job;
  job.framework = pytorch_framework_of(variant);
  job.compile_mode = suite.compile_mode_of(variant);
  job.run = run;
  job.repeat = repeat;
  job.metrics_path = out + "/runs/" + job.framework + "/" + run.id() + repeat_suffix(repeat) + ".json";
  job.log_path =
      workload_folder(out, "logs", run) + "/" + job.framework + "-" + run.run_id() + repeat_suffix(repeat) + ".log";
  // Checked as ptrain's run of the same job is: the same workload, data and schedule.
  job.train_arguments =
      ptrain_train_arguments(suite, run, out, out + "/runs/" + metrics::kFrameworkPtrain + "/" + run.id() + ".json");
  set_shape(job);
  if (run.master_weights) {
    job.unavailable = "PyTorch has no fp32 master weights for a model in pure half precision";
    return job;
  }
  const strategies::StrategySpec spec = run.spec();
  if (spec.drives_several_devices() && !suite.on_gpu) {
    job.unavailable = "PyTorch's DataParallel runs the module once on the CPU, without replicas";
    return job;
  }
  // PyTorch's own counterpart of the strategy (its descriptor row): ZeroRedundancyOptimizer shards the
  // optimizer state as zero1 does; FSDP's full-shard shards parameters, gradients and optimizer state as
  // zero3 does.
  const strategies::StrategyDescriptor& row = strategies::descriptor(spec);
  if (std::string(row.pytorch_strategy).empty()) {
    job.unavailable = row.pytorch_missing;
    return job;
  }
  if (row.pytorch_needs_cuda && !suite.on_gpu) {
    job.unavailable = std::string("PyTorch's ") + row.pytorch_class + " in the reference needs CUDA";
    return job;
  }
  if (row.pytorch_wraps_units && models::is_torchscript_path(workload_value(suite.workload_of(run), "model"))) {
    job.unavailable = std::string("PyTorch's ") + row.pytorch_class + " does not wrap TorchScript modules";
    return job;
  }
  if (run.fp8_beyond_defaults()) {
    job.unavailable = "the reference's fp8 is torchao's recipe (each tensor scaled by its own amax, the head in "
                      "bf16), not this run's" +
                      std::string(run.fp8_delayed_scaling ? " delayed scaling" : "") +
                      (run.fp8_head ? std::string(run.fp8_delayed_scaling ? " and" : "") + " FP8 head" : "");
    return job;
  }
  const std::string reference = row.pytorch_strategy;  // the strategy the reference trains with
  if (compiled) {
    if (!row.pytorch_compiles) {
      job.unavailable = "the reference compiles " + compiled_strategies() + " runs, not " + reference;
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
  const WorkloadKeys workload = suite.run_workload(run);  // with the run's own batch-size
  const std::string model = workload_value(workload, "model");
  const bool language_model = models::is_language_model(model.empty() ? config::TrainConfig{}.model.name : model);
  const std::string script = o.source_dir + "/bench/pytorch_reference.py";
  std::vector<std::string> args{script, "--precision", run.precision, "--strategy", reference,
                                "--metrics-out", job.metrics_path, "--device", suite.on_gpu ? "auto" : "cpu",
                                "--cache-dir", out + "/pytorch-cache"};
  if (row.pytorch_wraps_units) args.insert(args.end(), {"--fsdp-min-params", kFsdpMinNumParams});
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
    } else if (key == "cudnn-benchmark") {
      if (!truthy(value)) args.push_back("--no-cudnn-benchmark");
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
  // The mode named even where it is torch.compile's default: the job's command says what its record is.
  if (compiled) args.insert(args.end(), {"--compile", "--fused-optimizer", "--compile-mode", job.compile_mode});
  std::vector<std::string> command;
  if (compiled) {
    // Every compiled run of the bench shares TorchInductor's cache (kernels, graphs), kept with the bench's
    // other PyTorch caches: runs of one bench reuse what earlier ones compiled.
    command = {"env", "TORCHINDUCTOR_CACHE_DIR=" + out + "/pytorch-cache/inductor"};
  }
  command.push_back(o.python);
  if (spec.multi_process()) {
    command.insert(command.end(), {"-m", "torch.distributed.run", "--master_port", std::to_string(free_port()),
                                   "--nproc_per_node",
                                   std::to_string(run.devices), "--redirects", "1", "--tee", "1", "--log_dir",
                                   workload_folder(out, "logs", run) + "/torchrun-" +
                                       (compiled ? variant + "-" : "") + run.run_id()});
  } else if (spec.drives_several_devices()) {
    args.insert(args.end(), {"--gpus", std::to_string(run.devices)});
  }
  command.insert(command.end(), args.begin(), args.end());
  job.command = join_command(command);
  return job;
}

PytorchAbilities probe_pytorch(const std::string& python) {
  PytorchAbilities abilities;
  const std::string command =
      quoted(python) + " -c " +
      quoted("import torch, torchvision, numpy; print('torch', torch.__version__, hasattr(torch, 'compile'), "
             "torchvision.__version__, numpy.__version__)") +
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
  std::string torch_word, version, has_compile, torchvision, numpy;
  if (status == 0 && (words >> torch_word >> version >> has_compile >> torchvision >> numpy) && torch_word == "torch") {
    abilities.known = true;
    abilities.torch_version = version;
    abilities.has_compile = has_compile == "True";
    abilities.torchvision_version = torchvision;
    abilities.numpy_version = numpy;
  } else {
    const auto newline = output.find_last_not_of("\n");
    const std::string last = output.substr(0, newline == std::string::npos ? 0 : newline + 1);
    abilities.problem = python + " cannot import torch, torchvision and numpy" +
                        (last.empty() ? "" : ": " + last.substr(last.rfind('\n') == std::string::npos ? 0 : last.rfind('\n') + 1));
  }
  return abilities;
}

}  // namespace ptrain::bench
