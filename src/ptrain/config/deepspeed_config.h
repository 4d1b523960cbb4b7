// A DeepSpeed ds_config.json (`ptrain train --deepspeed-config FILE`) read into a typed ConfigOverlay:
//   zero_optimization  -> --strategy ddp/zero1/zero2/zero3 (stage 0-3), offload, bucket sizes, overlap
//   fp16, bf16         -> --precision fp16/bf16 with fp32 master weights (DeepSpeed keeps the model in
//                         half precision and an fp32 copy in the optimizer), loss scaling with
//                         DeepSpeed's rules (initial_scale_power, loss_scale_window, hysteresis, ...)
//   torch_autocast     -> --precision amp-fp16/amp-bf16
//   batch keys         -> --batch-size, --grad-accum (train_batch_size = micro x accumulation x world)
//   gradient_clipping, optimizer (SGD, Adam, AdamW), scheduler (WarmupLR, WarmupDecayLR,
//                         WarmupCosineLR, log or linear warm-up, as DeepSpeed computes them)
// "auto" (as accelerate and the HF Trainer write it) takes ptrain's own value, as the Trainer fills in its
// arguments: the flag's, given or ptrain's default, each said in one line. An "auto" learning rate under Adam or
// AdamW without --lr (ptrain's default is SGD's) and an "auto" ptrain has no setting for are errors naming the
// key. Keys with an effect
// ptrain cannot reproduce are errors naming the key; keys that cannot change the result are named in
// a warning. Flags, PTRAIN_* variables and --config keys win over the file (each such case is named
// in a warning when it overrides a value of the file): apply_overlay (config/config_overlay.h) merges.
// The sections are read in deepspeed_precision.cpp, deepspeed_zero.cpp and deepspeed_optimizer.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ptrain/config/batch_sizes.h"
#include "ptrain/config/config_overlay.h"
#include "ptrain/config/train_config.h"

namespace ptrain::config {

// Reads the file at path. before: the config as the flags, PTRAIN_* and --config left it, and given:
// the flags among them ("auto" and the keys that depend on the precision read them). Throws
// ptrain::Error naming the file and the key.
ConfigOverlay read_deepspeed_config(const std::string& path, const TrainConfig& before, const FlagsGiven& given);

// read_deepspeed_config then apply_overlay, the flags given being those set in app (already parsed from
// the command line, and after apply_yaml_config), which writes into config. world_size: processes of the
// job (from the launch environment). Returns the warnings to print.
std::vector<std::string> apply_deepspeed_config(const CLI::App& app, TrainConfig& config, const std::string& path,
                                                int64_t world_size);

}  // namespace ptrain::config
