// A reader for the pickle inside torch.save archives. LibTorch's own torch::pickle_load turns every
// collections.OrderedDict into None (its unpickler only expects them in tensor hooks), and a Python
// state_dict() is an OrderedDict, so it cannot read the files users actually have; this reader covers
// the pickle opcodes (protocols 2 to 5) and the torch globals that torch.save emits for tensors.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ptrain::io::detail {

struct PickleValue;
using PickleValuePtr = std::shared_ptr<PickleValue>;

struct PickleValue {
  // Object stands for an instance of a class this reader does not rebuild; `text` names the class.
  enum class Kind { None, Bool, Int, Float, String, Tuple, List, Dict, Global, Tensor, Object };
  Kind kind = Kind::None;
  int64_t integer = 0;  // Bool and Int
  double real = 0;
  std::string text;  // String, Global ("module.name"), Object (its class)
  std::vector<PickleValuePtr> items;                           // Tuple, List, Object's arguments
  std::vector<std::pair<PickleValuePtr, PickleValuePtr>> dict;  // in insertion order
  torch::Tensor tensor;

  // "dict", "int", "str", "tensor", "collections.Counter object", ... for error messages.
  std::string describe() const;
};

// Storage records by key ("0", "1", ...), as flat tensors of the given dtype.
using StorageLoader = std::function<torch::Tensor(const std::string& key, c10::ScalarType dtype)>;

// Throws std::runtime_error saying what is wrong (the caller adds the file name).
PickleValuePtr unpickle_torch_save(const std::string& pickle, const StorageLoader& load_storage);

}  // namespace ptrain::io::detail
