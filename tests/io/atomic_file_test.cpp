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

// A link at the path (a --metrics-out kept in a results folder, pointing at the latest run's file) was
// replaced by a plain file: the rename went over the link. Its target is written now, the link kept, through
// a relative link and a chain of two; a link pointing nowhere yet creates its target.
TEST(AtomicFile, ALinkIsKeptAndItsTargetWritten) {
  namespace fs = std::filesystem;
  TempDir dir;
  fs::create_directories(dir.file("results"));
  write_bytes(dir.file("results/run.json"), "old");
  fs::create_symlink("results/run.json", dir.file("latest.json"));
  fs::create_symlink(dir.file("latest.json"), dir.file("chain.json"));
  ptrain::io::write_file_atomically(dir.file("chain.json"), "new");
  EXPECT_TRUE(fs::is_symlink(dir.file("chain.json")));
  EXPECT_TRUE(fs::is_symlink(dir.file("latest.json")));
  EXPECT_EQ(read_bytes(dir.file("results/run.json")), "new");
  EXPECT_EQ(entries_in(dir.file("results")), 1u) << "a temporary file was left behind";

  fs::create_symlink("results/next.json", dir.file("dangling.json"));
  ptrain::io::write_file_atomically(dir.file("dangling.json"), "created");
  EXPECT_TRUE(fs::is_symlink(dir.file("dangling.json")));
  EXPECT_EQ(read_bytes(dir.file("results/next.json")), "created");

  fs::create_symlink(dir.file("loop_b"), dir.file("loop_a"));
  fs::create_symlink(dir.file("loop_a"), dir.file("loop_b"));
  const auto message = error_message<ptrain::Error>([&] { ptrain::io::write_file_atomically(dir.file("loop_a"), "x"); });
  EXPECT_NE(message.find(dir.file("loop_a") + ": too many levels of symbolic links"), std::string::npos) << message;
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
