#include "ptrain/io/safetensors.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include "expected_tensors.h"
#include "ptrain/core/error.h"
#include "test_support.h"

namespace {

using ptrain::testing::error_message;
using ptrain::testing::expect_same_tensors;
using ptrain::testing::expected_tensors;
using ptrain::testing::read_bytes;
using ptrain::testing::run_oracle;
using ptrain::testing::TempDir;
using ptrain::testing::write_bytes;

const std::map<std::string, std::string> kOracleMetadata = {{"format", "pt"}, {"producer", "ptrain-test"}};

TEST(Safetensors, RoundTripKeepsOrderDtypesValuesAndMetadata) {
  TempDir dir;
  const auto path = dir.file("t.safetensors");
  const std::map<std::string, std::string> metadata = {{"step", "12"}, {"note", "ünïcode and \"quotes\""}};
  ptrain::io::write_safetensors(path, expected_tensors(), metadata);
  std::map<std::string, std::string> read_metadata;
  expect_same_tensors(ptrain::io::read_safetensors(path, &read_metadata), expected_tensors());
  EXPECT_EQ(read_metadata, metadata);
}

// The checksum covers the header and the data: the file reads back unchanged, and a flipped bit in the data
// (which leaves a well-formed file) or in a metadata value is refused naming the file.
TEST(Safetensors, ChecksumDetectsAFlipInTheDataOrTheHeader) {
  TempDir dir;
  const auto path = dir.file("sum.safetensors");
  const std::map<std::string, std::string> metadata = {{"step", "12"}, {"note", "ünïcode and \"quotes\""}};
  ptrain::io::write_safetensors(path, expected_tensors(), metadata, /*checksum=*/true);
  std::map<std::string, std::string> read_metadata;
  expect_same_tensors(ptrain::io::read_safetensors(path, &read_metadata), expected_tensors());
  EXPECT_EQ(read_metadata.at("step"), "12");
  EXPECT_EQ(read_metadata.at("ptrain_checksum").rfind("crc32:", 0), 0u);
  const auto good = read_bytes(path);
  for (const size_t at : {good.size() - 1, good.size() - 30}) {  // inside the last tensor's data
    auto flipped = good;
    flipped[at] ^= 0x10;
    write_bytes(path, flipped);
    const std::string message = error_message<ptrain::Error>([&] { ptrain::io::read_safetensors(path); });
    EXPECT_NE(message.find(path + ": checksum mismatch"), std::string::npos) << at << ": " << message;
  }
  auto step = good;
  const std::string text(good.begin(), good.end());
  step[text.find("\"12\"") + 1] = '3';  // "12" -> "32": still valid JSON and a valid value
  write_bytes(path, step);
  EXPECT_NE(error_message<ptrain::Error>([&] { ptrain::io::read_safetensors(path); }).find("checksum mismatch"),
            std::string::npos);
  EXPECT_THROW(ptrain::io::write_safetensors(path, expected_tensors(), {{"ptrain_checksum", "x"}}, true), ptrain::Error);
}

// The checksum, as one pass of zlib over the header without its checksum entry, then the data: what
// write_safetensors computes in chunks on several threads (and read_safetensors verifies in chunks too).
std::string one_pass_checksum(const std::string& file) {
  uint64_t header_length = 0;
  std::memcpy(&header_length, file.data(), 8);
  std::string header = file.substr(8, header_length);
  header.erase(header.find_last_not_of(' ') + 1);
  const auto entry = header.find(",\"ptrain_checksum\":\"crc32:");
  EXPECT_NE(entry, std::string::npos) << header;
  header.erase(entry, std::string(",\"ptrain_checksum\":\"crc32:01234567\"").size());
  uLong crc = ::crc32_z(0L, reinterpret_cast<const Bytef*>(header.data()), header.size());
  crc = ::crc32_z(crc, reinterpret_cast<const Bytef*>(file.data() + 8 + header_length), file.size() - 8 - header_length);
  char text[32];
  std::snprintf(text, sizeof text, "crc32:%08lx", static_cast<unsigned long>(crc));
  return text;
}

// A checkpoint's checksum is taken in 64 MiB chunks on several threads and joined. A file of several chunks
// carries what one pass of zlib gives, and a flipped bit in a middle chunk is refused.
TEST(Safetensors, AChecksumTakenInChunksMatchesOnePassAndCatchesAFlipInAnyChunk) {
  TempDir dir;
  const auto path = dir.file("large.safetensors");
  torch::manual_seed(3);
  const auto large = torch::randint(0, 256, {150 << 20}, torch::kUInt8);  // three chunks: 64 + 64 + 22 MiB
  const ptrain::io::NamedTensors tensors = {{"small", torch::arange(5, torch::kFloat)}, {"large", large},
                                            {"after", torch::full({3}, 2.5, torch::kDouble)}};
  ptrain::io::write_safetensors(path, tensors, {{"step", "1"}}, /*checksum=*/true);
  std::map<std::string, std::string> metadata;
  expect_same_tensors(ptrain::io::read_safetensors(path, &metadata), tensors);
  auto bytes = read_bytes(path);
  EXPECT_EQ(metadata.at("ptrain_checksum"), one_pass_checksum(bytes));
  bytes[bytes.size() - 24 - (50 << 20)] ^= 0x01;  // 50 MiB before the large tensor's end: its second chunk
  write_bytes(path, bytes);
  const std::string message = error_message<ptrain::Error>([&] { ptrain::io::read_safetensors(path); });
  EXPECT_NE(message.find(path + ": checksum mismatch"), std::string::npos) << message;
}

// Tensors whose bytes are still arriving (an async checkpoint's copies from the device): before_reading is
// told of every span of data before anything reads it, each byte once, and the file is the one written
// without it. Here each span is filled only when announced: a read before that would write zeros.
TEST(Safetensors, EverySpanIsAnnouncedBeforeItIsRead) {
  TempDir dir;
  torch::manual_seed(4);
  const auto large = torch::randint(0, 256, {70 << 20}, torch::kUInt8);  // two chunks: 64 + 6 MiB
  const ptrain::io::NamedTensors tensors = {{"small", torch::arange(7, torch::kFloat)}, {"large", large}};
  ptrain::io::NamedTensors arriving;
  for (const auto& [name, tensor] : tensors) arriving.emplace_back(name, torch::zeros_like(tensor));
  std::mutex mutex;
  std::vector<std::pair<const char*, size_t>> announced;
  const auto arrive = [&](std::string_view span) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto* begin = static_cast<char*>(arriving[i].second.data_ptr());
      const size_t bytes = static_cast<size_t>(arriving[i].second.nbytes());
      if (span.data() < begin || span.data() + span.size() > begin + bytes) continue;
      std::memcpy(const_cast<char*>(span.data()), static_cast<const char*>(tensors[i].second.data_ptr()) + (span.data() - begin),
                  span.size());
    }
    const std::lock_guard<std::mutex> lock(mutex);
    announced.emplace_back(span.data(), span.size());
  };
  ptrain::io::write_safetensors(dir.file("arriving.safetensors"), arriving, {{"step", "2"}}, true, {}, arrive);
  ptrain::io::write_safetensors(dir.file("whole.safetensors"), tensors, {{"step", "2"}}, true);
  EXPECT_TRUE(read_bytes(dir.file("arriving.safetensors")) == read_bytes(dir.file("whole.safetensors")));
  std::sort(announced.begin(), announced.end());
  size_t total = 0;
  for (size_t i = 0; i < announced.size(); ++i) {
    total += announced[i].second;
    if (i > 0 && announced[i - 1].first + announced[i - 1].second > announced[i].first)
      ADD_FAILURE() << "spans " << i - 1 << " and " << i << " overlap";
  }
  EXPECT_EQ(total, static_cast<size_t>(large.nbytes() + 7 * 4));
}

TEST(Safetensors, ReadsFileWrittenByPythonOracle) {
  TempDir dir;
  const auto path = dir.file("python.safetensors");
  const auto oracle = run_oracle("safetensors_oracle.py", "write " + path);
  ASSERT_EQ(oracle.exit_code, 0) << oracle.output;
  std::map<std::string, std::string> metadata;
  expect_same_tensors(ptrain::io::read_safetensors(path, &metadata), expected_tensors());
  EXPECT_EQ(metadata, kOracleMetadata);
}

TEST(Safetensors, PythonOracleReadsWhatWeWrite) {
  TempDir dir;
  const auto path = dir.file("cpp.safetensors");
  ptrain::io::write_safetensors(path, expected_tensors(), kOracleMetadata);
  const auto oracle = run_oracle("safetensors_oracle.py", "check " + path);
  EXPECT_EQ(oracle.exit_code, 0) << oracle.output;
}

TEST(Safetensors, RefusesDuplicateNamesAndUnsupportedDtypes) {
  TempDir dir;
  const auto path = dir.file("bad.safetensors");
  auto message = error_message<ptrain::Error>([&] {
    ptrain::io::write_safetensors(path, {{"w", torch::ones(2)}, {"w", torch::ones(3)}});
  });
  EXPECT_NE(message.find("'w'"), std::string::npos) << message;
  message = error_message<ptrain::Error>([&] {
    ptrain::io::write_safetensors(path, {{"z", torch::ones(2, torch::kComplexFloat)}});
  });
  EXPECT_NE(message.find("'z'"), std::string::npos) << message;
  EXPECT_FALSE(std::filesystem::exists(path));
}

// A file with the given header text and data bytes, laid out as the format says.
std::string safetensors_bytes(const std::string& header, const std::string& data) {
  const uint64_t length = header.size();
  std::string bytes(reinterpret_cast<const char*>(&length), 8);
  return bytes + header + data;
}

std::string read_error(const std::string& path) {
  return error_message<ptrain::Error>([&] { ptrain::io::read_safetensors(path); });
}

void expect_error_naming(const std::string& path, const std::string& bytes, const std::string& phrase) {
  write_bytes(path, bytes);
  const auto message = read_error(path);
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find(phrase), std::string::npos) << "expected '" << phrase << "' in: " << message;
}

TEST(Safetensors, MissingFileIsNamed) {
  TempDir dir;
  const auto path = dir.file("absent.safetensors");
  EXPECT_NE(read_error(path).find(path), std::string::npos);
}

TEST(Safetensors, MalformedFilesAreRefusedWithTheFileNamed) {
  TempDir dir;
  const auto path = dir.file("bad.safetensors");
  const std::string eight_floats(32, '\0');
  expect_error_naming(path, "abc", "shorter than the 8-byte header length");
  expect_error_naming(path, safetensors_bytes("{}", "").substr(0, 9) + std::string(100, ' ').substr(0, 0),
                      "header length 2");
  expect_error_naming(path, safetensors_bytes("{\"w\": [1, 2", ""), "not valid JSON");
  expect_error_naming(path, safetensors_bytes("[1, 2]", ""), "not a JSON object");
  expect_error_naming(path,
                      safetensors_bytes(R"({"w":{"dtype":"F8_E4M3X","shape":[2],"data_offsets":[0,2]}})", "ab"),
                      "unknown dtype 'F8_E4M3X'");
  expect_error_naming(path,
                      safetensors_bytes(R"({"w":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})",
                                        eight_floats.substr(0, 20)),
                      "outside the 20 data bytes");
  expect_error_naming(path,
                      safetensors_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", eight_floats),
                      "need 12");
  expect_error_naming(path,
                      safetensors_bytes(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                        R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                                        eight_floats),
                      "overlap");
  expect_error_naming(path,
                      safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2]}})", eight_floats),
                      "no \"data_offsets\"");
  expect_error_naming(path,
                      safetensors_bytes(R"({"__metadata__":{"step":3}})", ""),
                      "'step' is not a string");
}

TEST(Safetensors, TruncatedFileIsNamed) {
  TempDir dir;
  const auto path = dir.file("cut.safetensors");
  ptrain::io::write_safetensors(path, expected_tensors());
  const auto whole = read_bytes(path);
  // Cut inside the data: the last tensors' offsets now point past the end.
  expect_error_naming(path, whole.substr(0, whole.size() - 10), "truncated");
  // Cut inside the header.
  uint64_t header_length = 0;
  std::memcpy(&header_length, whole.data(), 8);
  expect_error_naming(path, whole.substr(0, 8 + header_length / 2), "goes beyond the file");
}

}  // namespace
