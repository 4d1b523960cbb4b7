// A reader of TensorBoard event files written for the tests alone, from the formats' specifications (TFRecord
// framing, protobuf's wire format, tensorflow.Event / Summary / SessionLog field numbers), sharing no code with
// ptrain's writer: its CRC-32C is computed bit by bit, its protobuf fields parsed generically.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ptrain::testing {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), one bit at a time.
inline uint32_t bitwise_crc32c(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const char ch : bytes) {
    crc ^= static_cast<unsigned char>(ch);
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

inline uint32_t tfrecord_masked_crc(const std::string& bytes) {
  const uint32_t crc = bitwise_crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

struct DecodedScalar {
  std::string tag;
  float value = 0;
};

struct DecodedEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  bool has_summary = false;
  std::vector<DecodedScalar> scalars;
  int64_t session_log_status = -1;  // -1: no session_log
};

namespace event_file_detail {

inline uint64_t little_endian(const std::string& bytes, size_t at, size_t width) {
  if (at + width > bytes.size()) throw std::runtime_error("truncated fixed-width field");
  uint64_t value = 0;
  for (size_t i = 0; i < width; ++i) value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  return value;
}

// One protobuf field: its number, wire type, and either a number (varint, fixed) or the bytes.
struct Field {
  uint32_t number = 0, type = 0;
  uint64_t number_value = 0;
  std::string bytes;
};

inline uint64_t read_varint(const std::string& message, size_t& at) {
  uint64_t value = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (at >= message.size()) throw std::runtime_error("truncated varint");
    const auto byte = static_cast<unsigned char>(message[at++]);
    value |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if ((byte & 0x80) == 0) return value;
  }
  throw std::runtime_error("varint longer than 10 bytes");
}

inline std::vector<Field> parse_message(const std::string& message) {
  std::vector<Field> fields;
  size_t at = 0;
  while (at < message.size()) {
    const uint64_t key = read_varint(message, at);
    Field field;
    field.number = static_cast<uint32_t>(key >> 3);
    field.type = static_cast<uint32_t>(key & 7);
    switch (field.type) {
      case 0: field.number_value = read_varint(message, at); break;
      case 1: field.number_value = little_endian(message, at, 8); at += 8; break;
      case 5: field.number_value = little_endian(message, at, 4); at += 4; break;
      case 2: {
        const uint64_t size = read_varint(message, at);
        if (at + size > message.size()) throw std::runtime_error("length-delimited field past the message's end");
        field.bytes = message.substr(at, size);
        at += size;
        break;
      }
      default: throw std::runtime_error("unexpected wire type " + std::to_string(field.type));
    }
    fields.push_back(std::move(field));
  }
  return fields;
}

inline DecodedEvent decode_event(const std::string& data) {
  DecodedEvent event;
  for (const Field& f : parse_message(data)) {
    if (f.number == 1 && f.type == 1) std::memcpy(&event.wall_time, &f.number_value, 8);
    if (f.number == 2 && f.type == 0) event.step = static_cast<int64_t>(f.number_value);
    if (f.number == 3 && f.type == 2) event.file_version = f.bytes;
    if (f.number == 7 && f.type == 2) {  // session_log (6 is the deprecated log_message)
      event.session_log_status = 0;
      for (const Field& s : parse_message(f.bytes))
        if (s.number == 1 && s.type == 0) event.session_log_status = static_cast<int64_t>(s.number_value);
    }
    if (f.number == 5 && f.type == 2) {
      event.has_summary = true;
      for (const Field& value : parse_message(f.bytes)) {
        if (value.number != 1 || value.type != 2) continue;
        DecodedScalar scalar;
        bool simple = false;
        for (const Field& v : parse_message(value.bytes)) {
          if (v.number == 1 && v.type == 2) scalar.tag = v.bytes;
          if (v.number == 2 && v.type == 5) {
            const auto bits = static_cast<uint32_t>(v.number_value);
            std::memcpy(&scalar.value, &bits, 4);
            simple = true;
          }
        }
        if (!simple) throw std::runtime_error("summary value '" + scalar.tag + "' has no simple_value");
        event.scalars.push_back(scalar);
      }
    }
  }
  return event;
}

}  // namespace event_file_detail

// Every event of a TFRecord file, each record's two CRCs checked; std::runtime_error on anything malformed.
inline std::vector<DecodedEvent> read_event_file(const std::string& path) {
  using namespace event_file_detail;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<DecodedEvent> events;
  size_t at = 0;
  while (at < bytes.size()) {
    const std::string length_bytes = bytes.substr(at, 8);
    const uint64_t length = little_endian(bytes, at, 8);
    if (little_endian(bytes, at + 8, 4) != tfrecord_masked_crc(length_bytes))
      throw std::runtime_error("record at byte " + std::to_string(at) + ": length CRC mismatch");
    if (at + 12 + length + 4 > bytes.size()) throw std::runtime_error("record at byte " + std::to_string(at) + ": truncated");
    const std::string data = bytes.substr(at + 12, length);
    if (little_endian(bytes, at + 12 + length, 4) != tfrecord_masked_crc(data))
      throw std::runtime_error("record at byte " + std::to_string(at) + ": data CRC mismatch");
    events.push_back(decode_event(data));
    at += 12 + length + 4;
  }
  return events;
}

}  // namespace ptrain::testing
