#include "ptrain/metrics/tensorboard_writer.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "ptrain/core/error.h"

namespace ptrain::metrics {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "TFRecord and protobuf fixed-width fields are little-endian");

namespace {

std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;  // reflected Castagnoli
    table[i] = crc;
  }
  return table;
}

// Protobuf's wire format, for the fields of tensorflow.Event, Summary, Summary.Value and SessionLog used here.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, (field << 3) | type); }

template <typename T>
void put_fixed(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// Event: wall_time = 1 (double), step = 2 (int64), file_version = 3, summary = 5, session_log = 7.
std::string event_header(double wall_time, int64_t step) {
  std::string event;
  put_key(event, 1, kFixed64);
  put_fixed<double>(event, wall_time);
  if (step != 0) {
    put_key(event, 2, kVarint);
    put_varint(event, static_cast<uint64_t>(step));
  }
  return event;
}

// Summary: repeated Value value = 1; Value: tag = 1, simple_value = 2 (float).
std::string summary_of(const Scalars& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string entry;
    put_bytes(entry, 1, tag);
    put_key(entry, 2, kFixed32);
    put_fixed<float>(entry, static_cast<float>(value));
    put_bytes(summary, 1, entry);
  }
  return summary;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  uint32_t crc = 0xFFFFFFFFu;
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ bytes[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, const std::string& flag, double wall_time) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  check(!error, flag + " " + dir + ": cannot create the directory (" + error.message() + ")");
  const std::string stem = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(std::floor(wall_time))) +
                           "." + host_name() + "." + std::to_string(::getpid());
  // "x": never append to another writer's file (a second run of the same process within the same second).
  for (int attempt = 0; attempt < 100 && file_ == nullptr; ++attempt) {
    path_ = attempt == 0 ? stem : stem + "." + std::to_string(attempt);
    file_ = std::fopen(path_.c_str(), "wbx");
    if (file_ == nullptr && errno != EEXIST) break;
  }
  check(file_ != nullptr, flag + " " + dir + ": cannot create " + path_ + " (" + std::strerror(errno) + ")");
  std::string event = event_header(wall_time, 0);
  put_bytes(event, 3, "brain.Event:2");
  write_record(event);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::add_scalars(int64_t step, double wall_time, const Scalars& scalars) {
  std::string event = event_header(wall_time, step);
  put_bytes(event, 5, summary_of(scalars));
  write_record(event);
}

void TensorBoardWriter::add_restart(int64_t step, double wall_time) {
  std::string session_log;  // SessionLog: status = 1, START = 1
  put_key(session_log, 1, kVarint);
  put_varint(session_log, 1);
  std::string event = event_header(wall_time, step);
  put_bytes(event, 7, session_log);
  write_record(event);
}

void TensorBoardWriter::write_record(const std::string& event) {
  std::string record;
  put_fixed<uint64_t>(record, event.size());
  put_fixed<uint32_t>(record, masked_crc32c(record.data(), 8));
  record += event;
  put_fixed<uint32_t>(record, masked_crc32c(event.data(), event.size()));
  const bool written = std::fwrite(record.data(), 1, record.size(), file_) == record.size() && std::fflush(file_) == 0;
  if (written) return;
  const int error = errno;
  throw Error("cannot write the TensorBoard event file " + path_ + " (" + std::strerror(error) + ")");
}

}  // namespace ptrain::metrics
