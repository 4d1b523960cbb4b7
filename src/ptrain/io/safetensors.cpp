#include "ptrain/io/safetensors.h"

#include <nlohmann/json.hpp>
#include <zlib.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <string_view>
#include <thread>
#include <vector>

#include "ptrain/core/error.h"
#include "ptrain/io/atomic_file.h"
#include "ptrain/io/chunks.h"

namespace ptrain::io {

namespace {

using OrderedJson = nlohmann::ordered_json;

// The format stores little-endian data; copying raw tensor bytes is only right on a little-endian host.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

// The reference implementation refuses larger headers too; it keeps a corrupt length from allocating
// gigabytes before the JSON parser notices.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

const std::vector<std::pair<std::string, c10::ScalarType>>& dtype_table() {
  static const std::vector<std::pair<std::string, c10::ScalarType>> table = {
      {"F64", c10::ScalarType::Double}, {"F32", c10::ScalarType::Float}, {"F16", c10::ScalarType::Half},
      {"BF16", c10::ScalarType::BFloat16}, {"I64", c10::ScalarType::Long}, {"I32", c10::ScalarType::Int},
      {"I16", c10::ScalarType::Short}, {"I8", c10::ScalarType::Char}, {"U8", c10::ScalarType::Byte},
      {"BOOL", c10::ScalarType::Bool}};
  return table;
}

std::string dtype_name(c10::ScalarType type, const std::string& path, const std::string& key) {
  for (const auto& [name, scalar] : dtype_table()) {
    if (scalar == type) return name;
  }
  throw Error("cannot write " + path + ": tensor '" + key + "' has dtype " + c10::toString(type) +
              ", which safetensors I/O does not support");
}

c10::ScalarType scalar_type_of(const std::string& name, const std::string& path, const std::string& key) {
  for (const auto& [known, scalar] : dtype_table()) {
    if (known == name) return scalar;
  }
  throw Error(path + ": tensor '" + key + "' has unknown dtype '" + name + "'");
}

uint64_t read_le_u64(const char* p) {
  uint64_t value = 0;
  std::memcpy(&value, p, sizeof value);
  return value;
}

struct Entry {
  std::string key;
  c10::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

// Multiplies with an overflow check: a corrupt shape must give an error, not a wrapped-around size.
uint64_t expected_bytes(const std::vector<int64_t>& shape, size_t itemsize, const std::string& path,
                        const std::string& key) {
  uint64_t bytes = itemsize;
  for (int64_t dim : shape) {
    if (dim < 0) throw Error(path + ": tensor '" + key + "' has a negative dimension");
    if (dim != 0 && bytes > UINT64_MAX / static_cast<uint64_t>(dim)) {
      throw Error(path + ": tensor '" + key + "' has a shape too large to address");
    }
    bytes *= static_cast<uint64_t>(dim);
  }
  return bytes;
}

Entry parse_entry(const std::string& key, const OrderedJson& info, uint64_t data_bytes, const std::string& path) {
  const std::string where = path + ": tensor '" + key + "'";
  if (!info.is_object()) throw Error(where + ": header entry is not an object");
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!info.contains(field)) throw Error(where + ": header entry has no \"" + std::string(field) + "\"");
  }
  if (!info["dtype"].is_string()) throw Error(where + ": \"dtype\" is not a string");
  if (!info["shape"].is_array()) throw Error(where + ": \"shape\" is not an array");
  const auto& offsets = info["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    throw Error(where + ": \"data_offsets\" is not a pair of non-negative integers");
  }
  Entry entry;
  entry.key = key;
  entry.dtype = scalar_type_of(info["dtype"].get<std::string>(), path, key);
  for (const auto& dim : info["shape"]) {
    if (!dim.is_number_integer()) throw Error(where + ": \"shape\" holds a non-integer");
    entry.shape.push_back(dim.get<int64_t>());
  }
  entry.begin = offsets[0].get<uint64_t>();
  entry.end = offsets[1].get<uint64_t>();
  if (entry.begin > entry.end || entry.end > data_bytes) {
    throw Error(where + ": data_offsets [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) +
                "] lie outside the " + std::to_string(data_bytes) + " data bytes (truncated file?)");
  }
  const uint64_t needed = expected_bytes(entry.shape, c10::elementSize(entry.dtype), path, key);
  if (entry.end - entry.begin != needed) {
    throw Error(where + ": data_offsets span " + std::to_string(entry.end - entry.begin) +
                " bytes but its dtype and shape need " + std::to_string(needed));
  }
  return entry;
}

constexpr const char* kChecksumKey = "ptrain_checksum";

// CRC-32 of the header (without its checksum entry) and then the data section: a flipped byte anywhere in
// the tensors, their names, dtypes, shapes or the metadata changes it.
uLong crc_of(uLong crc, const void* data, size_t bytes) {
  // zlib answers a null buffer (an empty tensor's data pointer) with the initial value: skip empty spans.
  return bytes == 0 ? crc : ::crc32_z(crc, static_cast<const Bytef*>(data), bytes);
}
// The CRC-32 of spans one after another, continuing crc, computed in chunks on several threads and joined
// with crc32_combine: one thread's CRC runs at a few GB/s, seconds of a checkpoint of ten gigabytes, while
// the machine that wrote it has cores to spare.
uLong crc_of_spans(uLong crc, const std::vector<std::string_view>& spans) {
  const std::vector<std::string_view> chunks = chunks_of(spans);
  std::vector<uLong> crcs(chunks.size());
  for_each_index_in_parallel(chunks.size(), std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 16),
                             [&](size_t i) { crcs[i] = crc_of(0L, chunks[i].data(), chunks[i].size()); });
  for (size_t i = 0; i < chunks.size(); ++i)
    crc = ::crc32_combine(crc, crcs[i], static_cast<z_off_t>(chunks[i].size()));
  return crc;
}

uLong header_crc(const std::string& header_text) { return crc_of(::crc32_z(0L, Z_NULL, 0), header_text.data(), header_text.size()); }
std::string checksum_text(uLong crc) {
  char text[32];
  std::snprintf(text, sizeof(text), "crc32:%08lx", static_cast<unsigned long>(crc));
  return text;
}

// A file read where it is needed: the header with pread, then the rest mapped read-only, its pages read as
// the checksum and the tensor copies reach them. A file of gigabytes is never held twice (as bytes, then as
// tensors), and a large file that is no safetensors file is refused from its first bytes instead of being
// read whole first (std::bad_alloc).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    check(fd_ >= 0, "cannot open " + path + ": " + std::strerror(errno));
    struct stat info {};
    if (::fstat(fd_, &info) != 0 || !S_ISREG(info.st_mode)) {
      const std::string why = S_ISDIR(info.st_mode) ? "Is a directory" : "not a regular file";
      ::close(fd_);
      throw Error("cannot read " + path + ": " + why);
    }
    size_ = static_cast<uint64_t>(info.st_size);
  }
  ~SafetensorsFile() {
    if (mapped_ != nullptr) ::munmap(const_cast<char*>(mapped_), size_);
    ::close(fd_);
  }
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  uint64_t size() const { return size_; }

  std::string read_at(uint64_t offset, uint64_t bytes) const {
    std::string text(bytes, '\0');
    uint64_t done = 0;
    while (done < bytes) {
      const ssize_t n = ::pread(fd_, text.data() + done, bytes - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      check(n > 0, "cannot read " + path_ + ": " + (n < 0 ? std::strerror(errno) : "the file ended early"));
      done += static_cast<uint64_t>(n);
    }
    return text;
  }

  // The whole file, mapped on first use.
  const char* data() {
    if (mapped_ == nullptr && size_ > 0) {
      void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
      check(mapped != MAP_FAILED, "cannot read " + path_ + ": " + std::strerror(errno));
      mapped_ = static_cast<const char*>(mapped);
    }
    return mapped_;
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  const char* mapped_ = nullptr;
};

}  // namespace

namespace {

// The header of file, and its length in *header_bytes.
OrderedJson read_header(const SafetensorsFile& file, const std::string& path, uint64_t* header_bytes) {
  if (file.size() < 8) {
    throw Error(path + ": not a safetensors file: " + std::to_string(file.size()) +
                " bytes, shorter than the 8-byte header length");
  }
  *header_bytes = read_le_u64(file.read_at(0, 8).data());
  if (*header_bytes > kMaxHeaderBytes || *header_bytes > file.size() - 8) {
    throw Error(path + ": safetensors header length " + std::to_string(*header_bytes) +
                " goes beyond the file's " + std::to_string(file.size()) + " bytes (truncated or not safetensors)");
  }
  OrderedJson header;
  try {
    header = OrderedJson::parse(file.read_at(8, *header_bytes));
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": safetensors header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) throw Error(path + ": safetensors header is not a JSON object");
  return header;
}

void copy_metadata(const OrderedJson& info, const std::string& path, std::map<std::string, std::string>* metadata) {
  if (!info.is_object()) throw Error(path + ": \"__metadata__\" is not an object");
  for (const auto& [meta_key, value] : info.items()) {
    if (!value.is_string()) throw Error(path + ": __metadata__ entry '" + meta_key + "' is not a string");
    if (metadata != nullptr) (*metadata)[meta_key] = value.get<std::string>();
  }
}

}  // namespace

std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
  SafetensorsFile file(path);
  uint64_t header_bytes = 0;
  const OrderedJson header = read_header(file, path, &header_bytes);
  std::map<std::string, std::string> metadata;
  if (header.contains("__metadata__")) copy_metadata(header["__metadata__"], path, &metadata);
  return metadata;
}

NamedTensors read_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  SafetensorsFile file(path);
  uint64_t header_bytes = 0;
  OrderedJson header = read_header(file, path, &header_bytes);

  const uint64_t data_start = 8 + header_bytes;
  const uint64_t data_bytes = file.size() - data_start;
  const char* bytes = file.data();
  if (header.contains("__metadata__") && header["__metadata__"].is_object() &&
      header["__metadata__"].contains(kChecksumKey)) {
    auto& meta = header["__metadata__"];
    const auto stored = meta[kChecksumKey];
    meta.erase(kChecksumKey);
    const std::string computed =
        checksum_text(crc_of_spans(header_crc(header.dump()), {std::string_view(bytes + data_start, data_bytes)}));
    if (!stored.is_string() || stored.get<std::string>() != computed) {
      throw Error(path + ": checksum mismatch (stored " + (stored.is_string() ? stored.get<std::string>() : stored.dump()) +
                  ", contents give " + computed + "): the file is corrupt");
    }
    meta[kChecksumKey] = stored;
  }
  std::vector<Entry> entries;
  for (const auto& [key, info] : header.items()) {
    if (key == "__metadata__") {
      copy_metadata(info, path, metadata);
      continue;
    }
    entries.push_back(parse_entry(key, info, data_bytes, path));
  }

  // Writers lay tensors out in state_dict order, so data order recovers it whatever order the JSON
  // object lists its keys in (the reference writer sorts them).
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < entries.size(); ++i) {
    if (entries[i].begin < entries[i - 1].end) {
      throw Error(path + ": the data of tensors '" + entries[i - 1].key + "' and '" + entries[i].key + "' overlap");
    }
  }

  NamedTensors tensors;
  tensors.reserve(entries.size());
  for (const auto& entry : entries) {
    auto tensor = torch::empty(entry.shape, torch::TensorOptions().dtype(entry.dtype));
    if (entry.end > entry.begin) {
      std::memcpy(tensor.data_ptr(), bytes + data_start + entry.begin, entry.end - entry.begin);
    }
    tensors.emplace_back(entry.key, std::move(tensor));
  }
  return tensors;
}

std::string write_safetensors(const std::string& path, const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata, bool checksum,
                              const std::function<void()>& before_rename,
                              const std::function<void(std::string_view)>& before_reading, size_t threads) {
  check(!checksum || metadata.count(kChecksumKey) == 0,
        "cannot write " + path + ": metadata key '" + std::string(kChecksumKey) + "' is reserved for the checksum");
  OrderedJson header = OrderedJson::object();
  if (!metadata.empty() || checksum) {
    OrderedJson meta = OrderedJson::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header["__metadata__"] = std::move(meta);
  }
  std::vector<torch::Tensor> contiguous;
  contiguous.reserve(tensors.size());
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [key, tensor] : tensors) {
    check(key != "__metadata__", "cannot write " + path + ": '__metadata__' is reserved and cannot name a tensor");
    check(seen.insert(key).second, "cannot write " + path + ": tensor name '" + key + "' appears twice");
    check(tensor.defined(), "cannot write " + path + ": tensor '" + key + "' is undefined");
    auto cpu = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t size = static_cast<uint64_t>(cpu.numel()) * cpu.element_size();
    header[key] = OrderedJson{{"dtype", dtype_name(cpu.scalar_type(), path, key)},
                              {"shape", cpu.sizes().vec()},
                              {"data_offsets", {offset, offset + size}}};
    offset += size;
    contiguous.push_back(std::move(cpu));
  }
  // Written from the tensors' own memory: a checkpoint is never held twice in host memory. The checksum is
  // taken chunk by chunk by the threads that write them (one pass over the data, not a checksum pass and then
  // a write pass), so the header that holds it is written last, at a length laid out before: the checksum's
  // text has a fixed width.
  std::vector<std::string_view> data;
  for (const auto& tensor : contiguous)
    if (tensor.numel() > 0)
      data.emplace_back(static_cast<const char*>(tensor.data_ptr()), static_cast<size_t>(tensor.numel()) * tensor.element_size());
  const uLong crc_of_header = checksum ? header_crc(header.dump()) : 0;
  if (checksum) header["__metadata__"][kChecksumKey] = checksum_text(0);
  const auto header_bytes = [&header] {
    std::string text = header.dump();
    // Padding keeps the data 8-byte aligned for readers that map the file.
    text.append((8 - text.size() % 8) % 8, ' ');
    const uint64_t length = text.size();
    return std::string(reinterpret_cast<const char*>(&length), sizeof length) + text;
  };
  const std::vector<std::string_view> chunks = chunks_of(data);
  std::vector<uLong> crcs(chunks.size());
  std::string stored_checksum;
  BodyThenHead file;
  file.threads = threads;
  file.body = data;
  file.head_bytes = header_bytes().size();
  file.visit_chunk = [&](size_t i, std::string_view chunk) {
    if (before_reading) before_reading(chunk);
    if (checksum) crcs[i] = crc_of(0L, chunk.data(), chunk.size());
  };
  file.head = [&] {
    if (checksum) {
      uLong crc = crc_of_header;
      for (size_t i = 0; i < chunks.size(); ++i) crc = ::crc32_combine(crc, crcs[i], static_cast<z_off_t>(chunks[i].size()));
      stored_checksum = checksum_text(crc);
      header["__metadata__"][kChecksumKey] = stored_checksum;
    }
    return header_bytes();
  };
  write_file_atomically(path, file, before_rename);
  return stored_checksum;
}

}  // namespace ptrain::io
