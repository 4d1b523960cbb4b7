// A model the user brings: a TorchScript archive (torch.jit.script(model).save(path), or torch.jit.trace),
// trained as the zoo's models are. Its parameters and buffers keep the names PyTorch's state_dict() gives
// them, so weights move between the two both ways, and it offers the same Model interface:
//
// - units() come from its submodule tree. ptrain reads the forward graph: when forward is a chain of
//   submodule calls (each call's input the previous call's output, with any other computation in
//   between), each call is a unit; a called submodule whose own forward is such a chain (nn.Sequential,
//   an encoder holding a list of blocks) is opened in turn, so units are blocks as FSDP would wrap them
//   ("blocks.0", "blocks.1", ...). forward_unit(i) runs unit i with the computation that follows it up
//   to the next unit, cut out of the forward graph. A forward that is no chain (a skip connection around
//   its top-level blocks, a block called twice, a parameter used both inside a block and beside it) has
//   no units: zero3 and fsdp then gather the whole model at once, and units_note() says why.
// - activation checkpointing recomputes each unit whose forward draws no random numbers (dropout would
//   draw others in the recomputation) and reads no parameters outside it; the others keep their
//   activations, and checkpointing_note() names them.
// - The graph runs op by op through TorchScript's interpreter (the executor's optimisations are turned
//   off for the process when an archive is loaded), as eager PyTorch runs the module: every op goes
//   through the dispatcher, so autocast, the strategies' gradient hooks and their sharded parameter
//   storage apply to it as to a C++ module. bench/pytorch_reference.py runs it the same way.
#pragma once

#include <torch/script.h>

#include <memory>
#include <string>
#include <vector>

#include "ptrain/models/model.h"

namespace ptrain::models {

// Whether a --model value names a TorchScript file (it ends in .pt or .pth) rather than a zoo model.
bool is_torchscript_path(const std::string& name);

// What the data feeds the model, which load() checks the module against with a probe forward.
struct ScriptInput {
  std::vector<int64_t> sample_shape;  // images: {C, H, W}; tokens: {T}
  bool tokens = false;                // int64 token ids in, logits per position out
  int64_t classes = 0;                // images: the logits' width; tokens: at least the vocabulary
  std::string data_description;       // for messages
};

class TorchScriptModel : public Model {
 public:
  // Loads the archive, checks that forward takes one tensor and returns one tensor, and runs it (eval
  // mode, no gradients) on two samples of the data's shape, checking the logits' shape. Throws
  // ptrain::Error naming the file and what was expected, for a file that is no TorchScript archive
  // (a torch.save state dict is named as such) and for a module ptrain cannot train.
  static std::shared_ptr<TorchScriptModel> load(const std::string& path, const ScriptInput& input);

  torch::Tensor forward(torch::Tensor x) override;
  void set_activation_checkpointing(bool on) override;
  std::string name() const override { return path_; }
  // A copy of the module with its own parameters (the current values), for --strategy dp.
  std::shared_ptr<Model> make_replica() const override;
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> units() override;
  torch::Tensor forward_unit(size_t index, torch::Tensor x) override;

  // Also switches the module's training attribute (dropout, batch norm).
  void train(bool on = true) override;
  // As PyTorch's Module.to(dtype): floating-point parameters and buffers only (BatchNorm's
  // num_batches_tracked stays int64).
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  // Why units() is empty ("" when it is not).
  const std::string& units_note() const;
  // What a traced module's graph fixed when it was traced: batch norms and dropouts held in the training
  // or the eval mode whatever train() says, naming how to export instead; "" when they follow train().
  const std::string& recorded_mode_warning() const;
  // The units activation checkpointing leaves alone, and why ("" when it recomputes every one).
  std::string checkpointing_note() const;

  // The module itself (sharing parameters and buffers with this model).
  torch::jit::Module& script_module();

  struct Graphs;

 private:
  TorchScriptModel(std::string path, torch::jit::Module module);

  std::string path_;
  torch::jit::Module module_;
  std::shared_ptr<Graphs> graphs_;
  bool checkpointing_ = false;
};

}  // namespace ptrain::models
