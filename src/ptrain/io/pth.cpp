#include "ptrain/io/pth.h"

#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <set>
#include <sstream>

#include "ptrain/core/error.h"
#include "ptrain/io/atomic_file.h"
#include "ptrain/io/torch_unpickler.h"

namespace ptrain::io {

namespace {

using detail::PickleValue;
using detail::PickleValuePtr;

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

std::string key_text(const PickleValuePtr& key) {
  return key->kind == PickleValue::Kind::String ? key->text : "<" + key->describe() + ">";
}

NamedTensors tensors_of(const PickleValue& dict, const std::string& path, const std::string& where) {
  NamedTensors tensors;
  tensors.reserve(dict.dict.size());
  for (const auto& [key, value] : dict.dict) {
    if (key->kind != PickleValue::Kind::String) {
      throw Error(path + ": " + where + "has a key of type " + key->describe() + ", expected strings");
    }
    if (value->kind != PickleValue::Kind::Tensor) {
      throw Error(path + ": " + where + "entry '" + key->text + "' is a " + value->describe() + ", not a tensor");
    }
    tensors.emplace_back(key->text, value->tensor);
  }
  return tensors;
}

PickleValuePtr load_archive(const std::string& bytes, const std::string& path) {
  std::istringstream stream(bytes);
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> archive;
  try {
    archive = std::make_unique<caffe2::serialize::PyTorchStreamReader>(&stream);
  } catch (const std::exception& e) {
    throw Error(path + ": not a readable PyTorch zip archive (truncated or corrupt?): " + first_line(e.what()));
  }
  auto record = [&](const std::string& name) {
    if (!archive->hasRecord(name)) throw std::runtime_error("the archive has no record " + name);
    auto [data, size] = archive->getRecord(name);
    return std::make_pair(std::move(data), size);
  };
  try {
    if (archive->hasRecord("byteorder")) {
      auto [data, size] = record("byteorder");
      const std::string order(static_cast<const char*>(data.get()), size);
      if (order != "little") throw std::runtime_error("tensor data is stored " + order + "-endian");
    }
    auto [pickle_data, pickle_size] = record("data.pkl");
    const std::string pickle(static_cast<const char*>(pickle_data.get()), pickle_size);
    return detail::unpickle_torch_save(pickle, [&](const std::string& key, c10::ScalarType dtype) {
      auto [data, size] = record("data/" + key);
      const size_t itemsize = c10::elementSize(dtype);
      if (size % itemsize != 0) throw std::runtime_error("storage data/" + key + " has a partial element");
      auto storage = torch::empty({static_cast<int64_t>(size / itemsize)}, torch::dtype(dtype));
      if (size > 0) std::memcpy(storage.data_ptr(), data.get(), size);
      return storage;
    });
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(path + ": cannot read the PyTorch checkpoint (truncated or corrupt?): " + first_line(e.what()));
  }
}

}  // namespace

NamedTensors read_pth(const std::string& path) {
  const std::string bytes = read_file_bytes(path);
  // torch.save has written zip archives since PyTorch 1.6; saying so beats the zip reader's message.
  if (bytes.size() < 4 || bytes.compare(0, 4, "PK\x03\x04") != 0) {
    throw Error(path + ": not a PyTorch zip checkpoint (no zip signature; a legacy torch.save file, "
                "or not a torch.save file at all)");
  }
  const auto loaded = load_archive(bytes, path);
  if (loaded->kind != PickleValue::Kind::Dict) {
    throw Error(path + ": holds a " + loaded->describe() + ", expected a dict of tensors (a state_dict)");
  }
  for (const char* nested : {"state_dict", "model"}) {
    for (const auto& [key, value] : loaded->dict) {
      if (key->kind == PickleValue::Kind::String && key->text == nested && value->kind == PickleValue::Kind::Dict) {
        return tensors_of(*value, path, std::string("'") + nested + "' ");
      }
    }
  }
  std::string found;
  std::string first_non_tensor;
  for (const auto& [key, value] : loaded->dict) {
    if (value->kind != PickleValue::Kind::Tensor && first_non_tensor.empty()) {
      first_non_tensor = key_text(key) + "' is a " + value->describe();
    }
    if (found.size() < 300) found += (found.empty() ? "" : ", ") + key_text(key);
  }
  if (!first_non_tensor.empty()) {
    throw Error(path + ": expected a dict of tensors (or one holding them under 'state_dict' or 'model'), but entry '" +
                first_non_tensor + " (entries: " + found + ")");
  }
  return tensors_of(*loaded, path, "");
}

void write_pth(const std::string& path, const NamedTensors& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  std::set<std::string> seen;
  for (const auto& [key, tensor] : tensors) {
    check(seen.insert(key).second, "cannot write " + path + ": tensor name '" + key + "' appears twice");
    check(tensor.defined(), "cannot write " + path + ": tensor '" + key + "' is undefined");
    dict.insert(key, tensor.detach().to(torch::kCPU));
  }
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  write_file_atomically(path, std::string(bytes.begin(), bytes.end()));
}

}  // namespace ptrain::io
