// PyTorch's own checkpoint files: what torch.save(model.state_dict()) writes in Python, and files that
// Python's torch.load reads back as a dict of tensors.
#pragma once

#include <string>

#include "ptrain/io/named_tensors.h"

namespace ptrain::io {

// A torch.save'd dict of tensors (the zip format of PyTorch >= 1.6), in its insertion order, read with
// our own unpickler (torch_unpickler.h says why LibTorch's torch::pickle_load cannot read a state_dict). A top-level
// dict holding the tensors under "state_dict" or "model" (the usual training-checkpoint layouts) is
// accepted too. Throws ptrain::Error naming path for a missing, truncated or non-zip file, and for
// entries that are not tensors.
NamedTensors read_pth(const std::string& path);

// Written atomically (see atomic_file.h) as Python's torch.save writes a state dict: an OrderedDict of
// tensors that torch.load reads with weights_only=True (the default from PyTorch 2.6). Each tensor is stored
// from the CPU as a dense copy of its own (a view keeps its values, not its base's storage).
void write_pth(const std::string& path, const NamedTensors& tensors);

}  // namespace ptrain::io
