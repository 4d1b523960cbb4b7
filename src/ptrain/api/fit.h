// Training your model on your data from C++, with everything `ptrain train` offers: the same typed config
// (config/train_config.h: strategy, precision, optimizer, schedule, checkpoints, metrics), the same
// trainer, the same run record.
//
//   ptrain::TrainConfig config;
//   config.run.strategy = "zero3";           // single | dp | ddp | zero1 | zero2 | zero3 | fsdp
//   config.precision.precision = "amp-bf16";
//   config.run.batch_size = 64;
//   auto record = ptrain::fit(ptrain::wrap(std::make_shared<Net>(), "net"),
//                             ptrain::tensor_data(train_x, train_y, test_x, test_y), config);
//
// Strategies over several processes (ddp, zero*, fsdp) need the processes started by `ptrain launch` (or
// torchrun, Slurm, Open MPI): each one calls fit(), which finds its rank in the environment.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "ptrain/config/train_config.h"
#include "ptrain/data/dataset.h"
#include "ptrain/metrics/run_record.h"
#include "ptrain/models/model.h"
#include "ptrain/train/trainer.h"

namespace ptrain {

using TrainConfig = config::TrainConfig;
using RunRecord = metrics::RunRecord;
using StepReport = train::StepReport;
using TrainHooks = train::TrainHooks;

// Both splits of a data set, opened when training starts. Empty: config.data names one of ptrain's
// (data/registry.h: --dataset and --data-path).
struct Data {
  std::function<data::Dataset(bool train)> open;
};

// In-memory images, uint8 N x C x H x W with int64 labels N (CPU), or token sequences, int64 N x T with
// labels of the same shape (each position's next token). Augmented and normalised as config.data says
// (mean 0.5, std 0.5 for data that is none of ptrain's named sets).
Data tensor_data(torch::Tensor train_inputs, torch::Tensor train_labels, torch::Tensor test_inputs,
                 torch::Tensor test_labels, std::vector<std::string> classes = {});

// Trains `model` (ptrain::wrap of your module, a TorchScriptModel, or a zoo model) under config and
// returns the run record (rank 0's speaks for the job). config.model.name is set to the model's name.
RunRecord fit(std::shared_ptr<models::Model> model, const Data& data, TrainConfig config, const TrainHooks& hooks = {});

}  // namespace ptrain
