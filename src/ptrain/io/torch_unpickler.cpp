#include "ptrain/io/torch_unpickler.h"

#include <cstring>
#include <map>
#include <stdexcept>

namespace ptrain::io::detail {

namespace {

using Kind = PickleValue::Kind;

PickleValuePtr make(Kind kind) {
  auto value = std::make_shared<PickleValue>();
  value->kind = kind;
  return value;
}

PickleValuePtr make_int(int64_t v) {
  auto value = make(Kind::Int);
  value->integer = v;
  return value;
}

PickleValuePtr make_text(Kind kind, std::string text) {
  auto value = make(kind);
  value->text = std::move(text);
  return value;
}

c10::ScalarType storage_dtype(const std::string& storage_class) {
  static const std::map<std::string, c10::ScalarType> types = {
      {"torch.DoubleStorage", c10::ScalarType::Double}, {"torch.FloatStorage", c10::ScalarType::Float},
      {"torch.HalfStorage", c10::ScalarType::Half},     {"torch.BFloat16Storage", c10::ScalarType::BFloat16},
      {"torch.LongStorage", c10::ScalarType::Long},     {"torch.IntStorage", c10::ScalarType::Int},
      {"torch.ShortStorage", c10::ScalarType::Short},   {"torch.CharStorage", c10::ScalarType::Char},
      {"torch.ByteStorage", c10::ScalarType::Byte},     {"torch.BoolStorage", c10::ScalarType::Bool},
      {"torch.ComplexFloatStorage", c10::ScalarType::ComplexFloat},
      {"torch.ComplexDoubleStorage", c10::ScalarType::ComplexDouble}};
  const auto found = types.find(storage_class);
  if (found == types.end()) throw std::runtime_error("unsupported tensor storage type " + storage_class);
  return found->second;
}

std::vector<int64_t> int_tuple(const PickleValuePtr& value, const char* what) {
  if (value->kind != Kind::Tuple && value->kind != Kind::List) {
    throw std::runtime_error(std::string("tensor ") + what + " is a " + value->describe() + ", expected a tuple");
  }
  std::vector<int64_t> ints;
  for (const auto& item : value->items) {
    if (item->kind != Kind::Int) throw std::runtime_error(std::string("tensor ") + what + " holds a non-integer");
    ints.push_back(item->integer);
  }
  return ints;
}

// torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, hooks, ...).
PickleValuePtr rebuild_tensor(const std::vector<PickleValuePtr>& args) {
  if (args.size() < 4 || args[0]->kind != Kind::Tensor || args[1]->kind != Kind::Int) {
    throw std::runtime_error("malformed tensor record");
  }
  const auto& storage = args[0]->tensor;
  const auto size = int_tuple(args[2], "size");
  const auto stride = int_tuple(args[3], "stride");
  if (size.size() != stride.size()) throw std::runtime_error("tensor size and stride differ in length");
  // The farthest element must lie inside the storage, or as_strided would read past it.
  int64_t last = args[1]->integer;
  bool empty = false;
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] < 0 || stride[d] < 0) throw std::runtime_error("tensor has a negative size or stride");
    if (size[d] == 0) empty = true;
    last += (size[d] - 1) * stride[d];
  }
  if (!empty && (args[1]->integer < 0 || last >= storage.numel())) {
    throw std::runtime_error("tensor reaches beyond its storage of " + std::to_string(storage.numel()) + " elements");
  }
  auto value = make(Kind::Tensor);
  value->tensor = empty ? torch::empty(size, storage.options()) : storage.as_strided(size, stride, args[1]->integer);
  return value;
}

class Unpickler {
 public:
  Unpickler(const std::string& data, const StorageLoader& load_storage) : data_(data), load_storage_(load_storage) {}

  PickleValuePtr run() {
    while (true) {
      const auto op = static_cast<uint8_t>(byte());
      if (op == '.') break;
      step(op);
    }
    if (stack_.size() != 1) throw std::runtime_error("pickle ends with " + std::to_string(stack_.size()) + " values");
    return stack_.back();
  }

 private:
  char byte() {
    need(1);
    return data_[pos_++];
  }

  void need(uint64_t n) {
    if (n > data_.size() - pos_) throw std::runtime_error("pickle data ends early (truncated?)");
  }

  uint64_t unsigned_le(int n) {
    need(n);
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(data_[pos_ + i]);
    pos_ += n;
    return v;
  }

  std::string take(uint64_t n) {
    need(n);
    std::string s = data_.substr(pos_, n);
    pos_ += n;
    return s;
  }

  std::string line() {
    const auto end = data_.find('\n', pos_);
    if (end == std::string::npos) throw std::runtime_error("pickle data ends early (truncated?)");
    std::string s = data_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }

  PickleValuePtr pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
      throw std::runtime_error("pickle stack underflow");
    }
    auto v = stack_.back();
    stack_.pop_back();
    return v;
  }

  PickleValuePtr& top() {
    if (stack_.empty()) throw std::runtime_error("pickle stack underflow");
    return stack_.back();
  }

  std::vector<PickleValuePtr> pop_to_mark() {
    if (marks_.empty()) throw std::runtime_error("pickle MARK missing");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<PickleValuePtr> items(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
    return items;
  }

  PickleValuePtr tuple(std::vector<PickleValuePtr> items) {
    auto v = make(Kind::Tuple);
    v->items = std::move(items);
    return v;
  }

  void set_items(const PickleValuePtr& target, const std::vector<PickleValuePtr>& items) {
    if (target->kind != Kind::Dict) throw std::runtime_error("pickle SETITEM(S) on a " + target->describe());
    if (items.size() % 2 != 0) throw std::runtime_error("pickle SETITEMS with an odd number of values");
    for (size_t i = 0; i < items.size(); i += 2) target->dict.emplace_back(items[i], items[i + 1]);
  }

  void append_items(const PickleValuePtr& target, const std::vector<PickleValuePtr>& items) {
    if (target->kind != Kind::List) throw std::runtime_error("pickle APPEND(S) on a " + target->describe());
    target->items.insert(target->items.end(), items.begin(), items.end());
  }

  void memo_put(uint64_t index) { memo_[index] = top(); }

  PickleValuePtr memo_get(uint64_t index) {
    const auto found = memo_.find(index);
    if (found == memo_.end()) throw std::runtime_error("pickle refers to an unknown memo entry");
    return found->second;
  }

  PickleValuePtr reduce(const PickleValuePtr& callable, const PickleValuePtr& args) {
    if (callable->kind != Kind::Global || args->kind != Kind::Tuple) {
      throw std::runtime_error("pickle REDUCE on a " + callable->describe());
    }
    const std::string& name = callable->text;
    if (name == "collections.OrderedDict" || name == "builtins.dict") {
      if (!args->items.empty()) throw std::runtime_error(name + " built from arguments is not supported");
      return make(Kind::Dict);
    }
    if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor") {
      return rebuild_tensor(args->items);
    }
    if (name == "torch._utils._rebuild_parameter" || name == "torch._utils._rebuild_parameter_with_state") {
      if (args->items.empty() || args->items[0]->kind != Kind::Tensor) throw std::runtime_error("malformed Parameter");
      return args->items[0];
    }
    // LibTorch's own pickle_save tags typed containers with their TorchScript type; the value is args[0].
    if (name == "torch.jit._pickle.restore_type_tag" && !args->items.empty()) return args->items[0];
    auto object = make_text(Kind::Object, name);
    object->items = args->items;
    return object;
  }

  // ('storage', storage class, key, location, numel): the tensor data lives in the archive's data/<key>.
  PickleValuePtr persistent_load(const PickleValuePtr& pid) {
    if (pid->kind != Kind::Tuple || pid->items.size() < 3 || pid->items[0]->text != "storage" ||
        pid->items[1]->kind != Kind::Global || pid->items[2]->kind != Kind::String) {
      throw std::runtime_error("unsupported persistent id in pickle");
    }
    const auto dtype = storage_dtype(pid->items[1]->text);
    const std::string& key = pid->items[2]->text;
    auto found = storages_.find(key);
    if (found == storages_.end()) found = storages_.emplace(key, load_storage_(key, dtype)).first;
    auto value = make(Kind::Tensor);
    value->tensor = found->second;
    return value;
  }

  void step(uint8_t op) {
    switch (op) {
      case 0x80: byte(); break;                // PROTO
      case 0x95: unsigned_le(8); break;        // FRAME: framing only matters to streaming readers
      case '(': marks_.push_back(stack_.size()); break;
      case '0': pop(); break;
      case '1': pop_to_mark(); break;
      case 'N': stack_.push_back(make(Kind::None)); break;
      case 0x88:
      case 0x89: {
        auto v = make(Kind::Bool);
        v->integer = op == 0x88;
        stack_.push_back(v);
        break;
      }
      case 'J': stack_.push_back(make_int(static_cast<int32_t>(unsigned_le(4)))); break;
      case 'K': stack_.push_back(make_int(static_cast<int64_t>(unsigned_le(1)))); break;
      case 'M': stack_.push_back(make_int(static_cast<int64_t>(unsigned_le(2)))); break;
      case 0x8a: {  // LONG1: little-endian two's complement of n bytes
        const auto n = static_cast<int>(unsigned_le(1));
        if (n > 8) throw std::runtime_error("pickle integer wider than 64 bits");
        uint64_t v = n > 0 ? unsigned_le(n) : 0;
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);
        stack_.push_back(make_int(static_cast<int64_t>(v)));
        break;
      }
      case 'G': {  // BINFLOAT is big-endian
        need(8);
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint8_t>(data_[pos_ + i]);
        pos_ += 8;
        auto v = make(Kind::Float);
        std::memcpy(&v->real, &bits, 8);
        stack_.push_back(v);
        break;
      }
      case 'X': case 'T': case 'B': stack_.push_back(make_text(Kind::String, take(unsigned_le(4)))); break;
      case 0x8c: case 'U': case 'C': stack_.push_back(make_text(Kind::String, take(unsigned_le(1)))); break;
      case 0x8d: case 0x8e: stack_.push_back(make_text(Kind::String, take(unsigned_le(8)))); break;
      case ')': stack_.push_back(tuple({})); break;
      case 't': stack_.push_back(tuple(pop_to_mark())); break;
      case 0x85: case 0x86: case 0x87: {
        std::vector<PickleValuePtr> items(op - 0x84);
        for (auto it = items.rbegin(); it != items.rend(); ++it) *it = pop();
        stack_.push_back(tuple(std::move(items)));
        break;
      }
      case ']': stack_.push_back(make(Kind::List)); break;
      case 'l': {
        auto list = make(Kind::List);
        list->items = pop_to_mark();
        stack_.push_back(list);
        break;
      }
      case 'a': {
        auto item = pop();
        append_items(top(), {item});
        break;
      }
      case 'e': {
        auto items = pop_to_mark();
        append_items(top(), items);
        break;
      }
      case '}': stack_.push_back(make(Kind::Dict)); break;
      case 'd': {
        auto dict = make(Kind::Dict);
        set_items(dict, pop_to_mark());
        stack_.push_back(dict);
        break;
      }
      case 's': {
        auto value = pop();
        auto key = pop();
        set_items(top(), {key, value});
        break;
      }
      case 'u': {
        auto items = pop_to_mark();
        set_items(top(), items);
        break;
      }
      case 'c': {
        std::string module = line();
        stack_.push_back(make_text(Kind::Global, module + "." + line()));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        auto name = pop();
        auto module = pop();
        stack_.push_back(make_text(Kind::Global, module->text + "." + name->text));
        break;
      }
      case 'R':
      case 0x81: {  // REDUCE, NEWOBJ
        auto args = pop();
        auto callable = pop();
        stack_.push_back(reduce(callable, args));
        break;
      }
      case 'b': pop(); break;  // BUILD: object state (a state_dict's _metadata) is not needed
      case 'Q': {
        auto pid = pop();
        stack_.push_back(persistent_load(pid));
        break;
      }
      case 'q': memo_put(unsigned_le(1)); break;
      case 'r': memo_put(unsigned_le(4)); break;
      case 0x94: memo_put(memo_.size()); break;
      case 'h': stack_.push_back(memo_get(unsigned_le(1))); break;
      case 'j': stack_.push_back(memo_get(unsigned_le(4))); break;
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        throw std::runtime_error(std::string("unsupported pickle opcode ") + hex + " at byte " + std::to_string(pos_ - 1));
      }
    }
  }

  const std::string& data_;
  const StorageLoader& load_storage_;
  uint64_t pos_ = 0;
  std::vector<PickleValuePtr> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, PickleValuePtr> memo_;
  std::map<std::string, torch::Tensor> storages_;
};

}  // namespace

std::string PickleValue::describe() const {
  switch (kind) {
    case Kind::None: return "None";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::Tuple: return "tuple";
    case Kind::List: return "list";
    case Kind::Dict: return "dict";
    case Kind::Global: return "reference to " + text;
    case Kind::Tensor: return "tensor";
    case Kind::Object: return text + " object";
  }
  return "value";
}

PickleValuePtr unpickle_torch_save(const std::string& pickle, const StorageLoader& load_storage) {
  return Unpickler(pickle, load_storage).run();
}

}  // namespace ptrain::io::detail
