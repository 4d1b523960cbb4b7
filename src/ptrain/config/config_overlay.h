// A config file's settings as typed values laid over a TrainConfig. A reader of a file (a DeepSpeed
// ds_config.json: config/deepspeed_config.h) returns one; apply_overlay alone merges it into the config,
// where no flag, PTRAIN_* variable or --config key gave the setting first: those win, and where one
// replaces a value the file names, a warning says so.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ptrain/config/batch_sizes.h"
#include "ptrain/config/train_config.h"

namespace ptrain::config {

// A value a file gives and the key that gave it (warnings and errors name it). named_by_file: the file
// writes the key; false: the file format's default for a key the file leaves out, which a flag replaces
// without a warning.
template <class T>
struct FromFile {
  T value{};
  std::string key;
  bool named_by_file = true;
};
template <class T>
using Overlaid = std::optional<FromFile<T>>;

// The flags (long names without dashes: "batch-size") that the command line, PTRAIN_* variables and
// --config set before a file is read.
using FlagsGiven = std::set<std::string>;

// train_batch_size, train_micro_batch_size_per_gpu and gradient_accumulation_steps as the file gives
// them; "auto" takes ptrain's --batch-size or --grad-accum.
struct BatchKeysOfFile {
  bool any = false;  // the file names one of the three
  BatchKey train_batch{std::nullopt, "train_batch_size"};
  BatchKey micro_batch{std::nullopt, "train_micro_batch_size_per_gpu"};
  BatchKey accumulation{std::nullopt, "gradient_accumulation_steps"};
  bool micro_auto = false, accumulation_auto = false;
};

// A key the file gives as "auto" (as the Hugging Face Trainer's DeepSpeed templates write them): it takes
// ptrain's value of flag (given, or ptrain's default), which apply_overlay says in one line once the sources are
// merged. flag empty: value says what the key takes.
struct AutoKey {
  std::string key;
  std::string flag;
  std::string value;
};

struct ConfigOverlay {
  std::string source;  // the file, as warnings and errors name it

  // Precision and loss scaling.
  Overlaid<std::string> precision, loss_scale;
  Overlaid<bool> master_weights, consecutive_hysteresis;
  Overlaid<double> initial_loss_scale, min_loss_scale;
  Overlaid<int64_t> loss_scale_window, hysteresis;

  // Strategy, sharding and gradient communication.
  Overlaid<std::string> strategy, reduce_dtype;
  Overlaid<bool> offload_optimizer, offload_params, overlap_comm;
  Overlaid<double> bucket_cap_mb, reduce_bucket_mb;

  // Optimizer, schedule and clipping.
  Overlaid<std::string> optimizer, schedule, warmup_type;
  Overlaid<double> lr, weight_decay, beta1, beta2, eps, momentum, clip_grad_norm, warmup_epochs, warmup_min_lr;
  Overlaid<bool> nesterov;
  Overlaid<int64_t> warmup_steps, max_steps;
  // The cosine floor as a fraction of the run's final lr; --min-lr wins.
  std::optional<double> min_lr_ratio;
  // The warm-up's first rate as a fraction of the run's final lr (WarmupCosineLR's warmup_min_ratio);
  // --warmup-min-lr wins.
  std::optional<double> warmup_min_ratio;

  BatchKeysOfFile batch;

  // The keys the file leaves to ptrain ("auto"), in the order they are read.
  std::vector<AutoKey> auto_keys;

  // What reading the file found worth saying: keys without effect, approximations.
  std::vector<std::string> warnings;
};

// Merges overlay into config (already holding the flags, PTRAIN_* and --config values; given names the
// flags among them). A value outside its flag's range is a ptrain::Error naming the file's key and the
// flag. The batch keys resolve with world_size processes (resolve_batch_sizes). Returns the overlay's
// warnings followed by those of the merge, then a line for each "auto" key saying the value it took.
std::vector<std::string> apply_overlay(const ConfigOverlay& overlay, TrainConfig& config, const FlagsGiven& given,
                                       int64_t world_size);

}  // namespace ptrain::config
