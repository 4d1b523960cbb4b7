// Weights in and out of modules by the names PyTorch's state_dict() uses, so that checkpoints move
// between ptrain and PyTorch/torchvision both ways.
#pragma once

#include <torch/torch.h>

#include <string>

#include "ptrain/io/named_tensors.h"

namespace ptrain::models {

// Parameters and buffers with full dotted names, in PyTorch's order: per module its own parameters, then
// its own buffers, then its children in registration order. The tensors share storage with the module
// (detached, like state_dict()).
io::NamedTensors state_dict(const torch::nn::Module& module);

// Copies every tensor into the module, converting to each parameter's dtype and keeping its device.
// Strict: missing keys, unexpected keys and shape mismatches are all listed in one ptrain::Error that
// names source_name (the file) and, per key, the expected and found shapes; nothing is copied then.
void load_state_dict(torch::nn::Module& module, const io::NamedTensors& tensors, const std::string& source_name);

// By extension: .pth or .pt (torch.save format) and .safetensors; any other throws ptrain::Error naming it.
void load_weights(torch::nn::Module& module, const std::string& path);
void save_weights(const torch::nn::Module& module, const std::string& path);
// The same for tensors already collected (e.g. gathered from the shards of a sharded strategy).
void write_weights(const std::string& path, const io::NamedTensors& tensors);

}  // namespace ptrain::models
