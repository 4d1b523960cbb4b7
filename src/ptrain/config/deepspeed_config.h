// A DeepSpeed ds_config.json (`ptrain train --deepspeed-config FILE`) mapped onto the typed config:
//   zero_optimization  -> --strategy ddp/zero1/zero2/zero3 (stage 0-3), offload, bucket sizes, overlap
//   fp16, bf16         -> --precision fp16/bf16 with fp32 master weights (DeepSpeed keeps the model in
//                         half precision and an fp32 copy in the optimizer), loss scaling with
//                         DeepSpeed's rules (initial_scale_power, loss_scale_window, hysteresis, ...)
//   torch_autocast     -> --precision amp-fp16/amp-bf16
//   batch keys         -> --batch-size, --grad-accum (train_batch_size = micro x accumulation x world)
//   gradient_clipping, optimizer (SGD, Adam, AdamW), scheduler (WarmupLR, WarmupCosineLR, linear warm-up)
// "auto" (as accelerate and the HF Trainer write it) keeps ptrain's own value. Keys with an effect
// ptrain cannot reproduce are errors naming the key; keys that cannot change the result are named in
// a warning. Flags, PTRAIN_* variables and --config keys win over the file (each such case is named
// in a warning when it overrides a value of the file).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ptrain/config/train_config.h"

namespace ptrain::config {

// One of train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps: its value
// (none: absent, or "auto" for train_batch_size) and what gave it (a key or a flag, for errors).
struct BatchKey {
  std::optional<int64_t> value;
  std::string source;
};

struct BatchSizes {
  int64_t micro_batch = 0;   // per device per micro-step
  int64_t accumulation = 0;  // micro-steps per optimizer step
  int64_t train_batch = 0;   // micro_batch x accumulation x world_size
};

// DeepSpeed's rule: the missing ones of the three follow from those given (accumulation 1 when only a
// batch size is given). All three given and disagreeing, or a division that does not come out whole,
// is a ptrain::Error naming the keys and the numbers.
BatchSizes resolve_batch_sizes(const BatchKey& train_batch, const BatchKey& micro_batch, const BatchKey& accumulation,
                               int64_t world_size);

// Reads the file at path and applies it to app (already parsed from the command line, and after
// apply_yaml_config) and to config, which app writes into. world_size: processes of the job (from the
// launch environment). Returns the warnings to print; throws ptrain::Error naming the file and key.
std::vector<std::string> apply_deepspeed_config(CLI::App& app, TrainConfig& config, const std::string& path,
                                                int64_t world_size);

}  // namespace ptrain::config
