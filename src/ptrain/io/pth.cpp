#include "ptrain/io/pth.h"

#include <caffe2/serialize/inline_container.h>

#include <cstdint>
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

namespace {

// The pickle Python's torch.save writes for a state dict (protocol 2), from the opcodes and globals that
// torch.load(weights_only=True) accepts: an OrderedDict of torch._utils._rebuild_tensor_v2 calls whose
// storages are persistent ids ('storage', torch.<Type>Storage, key, 'cpu', numel) naming data/<key>.
class StateDictPickler {
 public:
  StateDictPickler() { out_ += "\x80\x02"; }

  void begin_ordered_dict() {
    global("collections", "OrderedDict");
    out_ += ")R";  // OrderedDict(): EMPTY_TUPLE, REDUCE
  }
  void mark() { out_ += '('; }
  void set_items() { out_ += 'u'; }
  void stop() { out_ += '.'; }

  void tensor(const std::string& storage_class, const std::string& key, int64_t numel, at::IntArrayRef sizes,
              at::IntArrayRef strides) {
    global("torch._utils", "_rebuild_tensor_v2");
    mark();
    mark();
    text("storage");
    global("torch", storage_class);
    text(key);
    text("cpu");
    integer(numel);
    out_ += "tQ";  // TUPLE, BINPERSID
    integer(0);    // storage offset
    int_tuple(sizes);
    int_tuple(strides);
    out_ += '\x89';  // requires_grad: NEWFALSE
    begin_ordered_dict();  // backward hooks
    out_ += "tR";     // TUPLE, REDUCE
  }

  void text(const std::string& value) {
    out_ += 'X';
    little_endian(value.size(), 4);
    out_ += value;
  }

  const std::string& bytes() const { return out_; }

 private:
  void global(const std::string& module, const std::string& name) { out_ += "c" + module + "\n" + name + "\n"; }

  void integer(int64_t value) {
    if (value >= 0 && value < 256) {
      out_ += 'K';
      little_endian(static_cast<uint64_t>(value), 1);
    } else if (value >= 0 && value < 65536) {
      out_ += 'M';
      little_endian(static_cast<uint64_t>(value), 2);
    } else if (value >= INT32_MIN && value <= INT32_MAX) {
      out_ += 'J';
      little_endian(static_cast<uint32_t>(static_cast<int32_t>(value)), 4);
    } else {
      out_ += "\x8a\x08";  // LONG1 of 8 bytes, two's complement
      little_endian(static_cast<uint64_t>(value), 8);
    }
  }

  void int_tuple(c10::IntArrayRef values) {
    static const char kSmallTuples[] = {')', '\x85', '\x86', '\x87'};  // EMPTY_TUPLE, TUPLE1..3
    if (values.size() > 3) mark();
    for (const auto v : values) integer(v);
    out_ += values.size() <= 3 ? kSmallTuples[values.size()] : 't';
  }

  void little_endian(uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out_ += static_cast<char>((value >> (8 * i)) & 0xff);
  }

  std::string out_;
};

std::string storage_class_of(c10::ScalarType dtype, const std::string& path, const std::string& key) {
  switch (dtype) {
    case c10::ScalarType::Double: return "DoubleStorage";
    case c10::ScalarType::Float: return "FloatStorage";
    case c10::ScalarType::Half: return "HalfStorage";
    case c10::ScalarType::BFloat16: return "BFloat16Storage";
    case c10::ScalarType::Long: return "LongStorage";
    case c10::ScalarType::Int: return "IntStorage";
    case c10::ScalarType::Short: return "ShortStorage";
    case c10::ScalarType::Char: return "CharStorage";
    case c10::ScalarType::Byte: return "ByteStorage";
    case c10::ScalarType::Bool: return "BoolStorage";
    case c10::ScalarType::ComplexFloat: return "ComplexFloatStorage";
    case c10::ScalarType::ComplexDouble: return "ComplexDoubleStorage";
    default:
      throw Error("cannot write " + path + ": tensor '" + key + "' has dtype " + c10::toString(dtype) +
                  ", which a .pt state dict cannot hold");
  }
}

}  // namespace

void write_pth(const std::string& path, const NamedTensors& tensors) {
  std::set<std::string> seen;
  StateDictPickler pickle;
  std::vector<torch::Tensor> storages;
  pickle.begin_ordered_dict();
  pickle.mark();
  for (const auto& [key, tensor] : tensors) {
    check(seen.insert(key).second, "cannot write " + path + ": tensor name '" + key + "' appears twice");
    check(tensor.defined(), "cannot write " + path + ": tensor '" + key + "' is undefined");
    // Each tensor its own dense storage: a view's offset and strides are not worth its base's bytes.
    const auto dense = tensor.detach().to(torch::kCPU).contiguous();
    const std::string storage_class = storage_class_of(dense.scalar_type(), path, key);
    pickle.text(key);
    pickle.tensor(storage_class, std::to_string(storages.size()), dense.numel(), dense.sizes(), dense.strides());
    storages.push_back(dense);
  }
  pickle.set_items();
  pickle.stop();

  std::string bytes;
  {
    caffe2::serialize::PyTorchStreamWriter archive([&](const void* data, size_t size) {
      bytes.append(static_cast<const char*>(data), size);
      return size;
    });
    archive.setMinVersion(3);  // what Python's torch.save records
    archive.writeRecord("data.pkl", pickle.bytes().data(), pickle.bytes().size());
    archive.writeRecord("byteorder", "little", 6);
    for (size_t i = 0; i < storages.size(); ++i) {
      const auto& storage = storages[i];
      archive.writeRecord("data/" + std::to_string(i), storage.data_ptr(),
                          static_cast<size_t>(storage.numel()) * storage.element_size());
    }
    archive.writeEndOfFile();
  }
  write_file_atomically(path, bytes);
}

}  // namespace ptrain::io
