// The sections of a ds_config.json, each read into the one ConfigOverlay (deepspeed_config.cpp reads the
// top level and hands every section to its reader here).
#pragma once

#include <string>

#include "ptrain/config/config_overlay.h"
#include "ptrain/config/deepspeed_keys.h"
#include "ptrain/config/train_config.h"
#include "ptrain/precision/policy.h"

namespace ptrain::config::deepspeed {

// What each section reader reads with: the file's keys, the config as the sources before the file left
// it (flags, PTRAIN_*, --config: "auto" and precision-dependent keys depend on it), and the overlay.
struct Reading {
  KeyReader keys;
  const TrainConfig& before;
  const FlagsGiven& given;
  ConfigOverlay& overlay;

  // The run's precision: the one given before the file, else the file's, else ptrain's default.
  std::string final_precision() const;
  precision::PrecisionMode final_mode() const { return precision::mode_named(final_precision()); }
};

struct PrecisionBlocks {
  json fp16, bf16, autocast;  // null where the file has no such block
  std::string bf16_key = "bf16";  // or its older spelling "bfloat16"
};

// fp16, bf16 and torch_autocast: the precision mode, master weights and DeepSpeed's loss scaler rules
// (deepspeed_precision.cpp).
void read_precision(Reading& r, const PrecisionBlocks& blocks);

// zero_optimization: the strategy of the stage, offload, bucket sizes and overlap (deepspeed_zero.cpp).
void read_zero_optimization(Reading& r, const json& zero);
// communication_data_type: the dtype gradients are reduced in (deepspeed_zero.cpp).
void read_communication_dtype(Reading& r, const json& value, const std::string& key);

// optimizer (SGD, Adam, AdamW) and scheduler (WarmupLR, WarmupDecayLR, WarmupCosineLR) (deepspeed_optimizer.cpp).
void read_optimizer(Reading& r, const json& block);
void read_scheduler(Reading& r, const json& block);

}  // namespace ptrain::config::deepspeed
