// The Plan's sections (train/plan.h): the config's values as make_plan resolves them, each in the types of
// the part of the run that uses it. The run (train/run/ and the phases of training_run.h), `ptrain estimate` and
// --dry-run read these, never the config, so that nothing after make_plan decides again what it decided.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ptrain/models/model.h"
#include "ptrain/train/optimizer.h"
#include "ptrain/train/schedule.h"

namespace ptrain::train {

// The model the run builds and how it runs it.
struct ModelSetup {
  std::string name;          // a zoo name, or a TorchScript file (.pt)
  std::string weights;       // initial weights; empty: random init
  std::string save_weights;  // where the trained weights go; empty: nowhere
  bool activation_checkpointing = false;
  // GPT models: the named size's shape overridden where not 0.
  int64_t gpt_layers = 0, gpt_width = 0, gpt_heads = 0, vocab_size = 0;
  // --no-fused-kernels, --no-relu-recompute, --no-conv-bn-fusion and --skip-fusions, which make_plan checked
  // against the device and the precision.
  bool fused_kernels = true;
  bool relu_recompute = true;
  bool conv_bn_fusion = true;
  std::vector<std::string> skip_fusions;
  models::Fp8Options fp8;  // --fp8-head and --fp8-scaling, read under --precision fp8 only
};

// How the run reads its data, beside the data::DataSpec that names it.
struct DataOptions {
  int64_t loader_threads = 2;
  int64_t prefetch = 2;     // batches kept ready ahead of the step
  int64_t train_limit = 0;  // the first N training samples; 0: all
  int64_t test_limit = 0;   // the first N test samples; 0: all
  bool augment = true;      // random crop and flip on training batches
};

// What an optimizer step does besides the update of optimizer.h: its rate, and the gradient's bound.
struct Optimization {
  OptimizerOptions optimizer;
  ScheduleOptions schedule;
  double clip_grad_norm = 0;  // 0: no clipping
};

// What the run does between its steps: its seed, when it evaluates, how often it reads progress.
struct Cadence {
  uint64_t seed = 0;
  int64_t eval_batch_size = 0;  // 0: the training batch size
  bool eval_each_epoch = true;
  int64_t log_every = 50;  // optimizer steps between progress reads of the loss
  int64_t stop_at_step = 0;  // pause after this optimizer step; 0: none
};

// --checkpoint-dir and the flags that shape what it holds.
struct CheckpointOptions {
  std::string dir;  // empty: no checkpoints
  int64_t every = 0;  // also save every N optimizer steps; 0: only at epoch ends
  int64_t keep = 0;   // keep the newest N; 0: all
  bool overwrite = false;
  bool async = false;
};

// What the run shows and writes as it goes, besides checkpoints and its record.
struct Reporting {
  std::string progress = "auto";  // auto | bar | lines | none
  std::string tensorboard;        // a directory; empty: none
  std::string log_jsonl;          // empty: none
  std::string profile_out;        // a Chrome trace; empty: none
  // --profile-steps as given (the trainer's errors quote it), and the optimizer steps it names (1-based, inclusive).
  std::string profile_steps;
  int64_t profile_first_step = 0, profile_last_step = 0;
};

// How the process uses its device.
struct DeviceSetup {
  int64_t threads = 0;          // intra-op CPU threads, resolved (never 0)
  bool cudnn_benchmark = true;
  bool cuda_graphs = true;      // whether the step may be captured at all
};

// The precision flags as given, which describe() shows beside the policy they resolved to.
struct PrecisionFlags {
  std::string loss_scale;        // --loss-scale
  std::string fsdp_param_dtype;  // --param-dtype; empty: the precision mode's
};

}  // namespace ptrain::train
