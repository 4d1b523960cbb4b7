#include "ptrain/io/atomic_file.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "ptrain/core/error.h"
#include "test_support.h"

namespace {

using ptrain::testing::error_message;
using ptrain::testing::read_bytes;
using ptrain::testing::TempDir;
using ptrain::testing::write_bytes;

size_t entries_in(const std::string& dir) {
  return static_cast<size_t>(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()));
}

TEST(AtomicFile, WritesNewAndReplacesExistingFile) {
  TempDir dir;
  const auto path = dir.file("out.bin");
  ptrain::io::write_file_atomically(path, std::string("first\0version", 13));
  EXPECT_EQ(read_bytes(path), std::string("first\0version", 13));
  ptrain::io::write_file_atomically(path, [](std::ostream& out) { out << "second"; });
  EXPECT_EQ(ptrain::io::read_file_bytes(path), "second");
  EXPECT_EQ(entries_in(dir.path()), 1u) << "a temporary file was left behind";
}

TEST(AtomicFile, FailingWriterLeavesOldFileAndNoTemporary) {
  TempDir dir;
  const auto path = dir.file("checkpoint.bin");
  write_bytes(path, "old contents");
  const auto message = error_message<ptrain::Error>([&] {
    ptrain::io::write_file_atomically(path, [](std::ostream& out) {
      out << "half of the new";
      throw std::runtime_error("serialiser broke");
    });
  });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("serialiser broke"), std::string::npos) << message;
  EXPECT_EQ(read_bytes(path), "old contents");
  EXPECT_EQ(entries_in(dir.path()), 1u) << "a temporary file was left behind";
}

TEST(AtomicFile, MissingDirectoryIsNamed) {
  TempDir dir;
  const auto path = dir.file("no/such/dir/out.bin");
  const auto message = error_message<ptrain::Error>([&] { ptrain::io::write_file_atomically(path, "x"); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
}

TEST(AtomicFile, ReadingMissingFileOrDirectoryNamesPath) {
  TempDir dir;
  const auto missing = dir.file("missing.bin");
  auto message = error_message<ptrain::Error>([&] { ptrain::io::read_file_bytes(missing); });
  EXPECT_NE(message.find(missing), std::string::npos) << message;
  message = error_message<ptrain::Error>([&] { ptrain::io::read_file_bytes(dir.path()); });
  EXPECT_NE(message.find(dir.path()), std::string::npos) << message;
}

}  // namespace
