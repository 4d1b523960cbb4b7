// A model brought from outside the zoo (a TorchScript archive) is run once before training as the run will
// run it: in train mode with gradients and in eval mode without, under the run's autocast, on its device
// and in its dtypes. Some ops fail in only one of these (nn.TransformerEncoderLayer's eval-mode fast path
// under CPU autocast to bfloat16): the run then stops before its first step, not after an epoch of training
// that it could neither evaluate nor save.
#pragma once

#include <string>

#include <torch/torch.h>

#include "ptrain/models/model.h"
#include "ptrain/precision/policy.h"

namespace ptrain::train {

// Throws ptrain::Error naming --model `name`, the mode that failed, the precision and LibTorch's message.
// The model's buffers (batch-norm statistics), its mode and the device's random generator (dropout) are
// left as they were, so that the run trains exactly as it would have without the probe.
void probe_as_trained(models::Model& model, const std::string& name, const torch::Tensor& batch,
                      const precision::PrecisionPolicy& policy, const torch::Device& device);

}  // namespace ptrain::train
