// ptrain as a library: everything a C++ program needs to train its own LibTorch module, or a TorchScript
// export, under any strategy and precision. Link ptrain::ptrain (CMake: find_package(ptrain)) or use
// pkg-config's ptrain.
#pragma once

#include "ptrain/api/fit.h"                      // defines: fit, tensor_data, Data, TrainConfig, RunRecord
#include "ptrain/api/user_model.h"               // defines: wrap, fully_shard, Sharded, ModuleModel
#include "ptrain/config/train_config.h"          // defines: the typed config tree of `ptrain train`
#include "ptrain/models/state_dict.h"            // defines: load_weights, save_weights (PyTorch's names)
#include "ptrain/models/torchscript_model.h"     // defines: TorchScriptModel
#include "ptrain/precision/autocast_guard.h"     // defines: AutocastGuard (torch.autocast's semantics)
#include "ptrain/precision/loss_scaler.h"        // defines: LossScaler (torch.amp.GradScaler's rules)
