// Output paths are checked before a run starts, and nothing is created by the check.
#include "ptrain/io/output_path.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "ptrain/core/error.h"
#include "test_support.h"

namespace {

using ptrain::testing::error_message;
using ptrain::testing::TempDir;

TEST(OutputPath, WritableFilesAndDirectoriesPassAndNothingIsCreated) {
  TempDir dir;
  EXPECT_NO_THROW(ptrain::io::check_writable_file(dir.file("a/b/run.json"), "--metrics-out"));
  EXPECT_NO_THROW(ptrain::io::check_writable_directory(dir.file("ckpt/sub"), "--checkpoint-dir"));
  EXPECT_NO_THROW(ptrain::io::check_writable_directory(dir.path(), "--checkpoint-dir"));
  EXPECT_FALSE(std::filesystem::exists(dir.file("a")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("ckpt")));
}

TEST(OutputPath, AFileWhereADirectoryMustBeIsNamed) {
  TempDir dir;
  const auto file = dir.file("plain");
  std::ofstream(file) << "x";
  const std::string under = error_message<ptrain::Error>(
      [&] { ptrain::io::check_writable_file(file + "/m.json", "--metrics-out"); });
  EXPECT_NE(under.find("--metrics-out " + file + "/m.json: cannot be created, " + file + " is a file"), std::string::npos)
      << under;
  const std::string deeper = error_message<ptrain::Error>(
      [&] { ptrain::io::check_writable_directory(file + "/x/y", "--checkpoint-dir"); });
  EXPECT_NE(deeper.find(file + " is a file"), std::string::npos) << deeper;
  const std::string itself =
      error_message<ptrain::Error>([&] { ptrain::io::check_writable_directory(file, "--checkpoint-dir"); });
  EXPECT_NE(itself.find("--checkpoint-dir " + file + ": is a file, not a directory"), std::string::npos) << itself;
  const std::string directory =
      error_message<ptrain::Error>([&] { ptrain::io::check_writable_file(dir.path(), "--metrics-out"); });
  EXPECT_NE(directory.find("is a directory"), std::string::npos) << directory;
}

TEST(OutputPath, AReadOnlyDirectoryIsNamed) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into read-only directories (scripts/fault_suite.sh mounts one)";
  TempDir dir;
  const auto locked = dir.file("locked");
  std::filesystem::create_directories(locked);
  std::filesystem::permissions(locked, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  const std::string message =
      error_message<ptrain::Error>([&] { ptrain::io::check_writable_directory(locked + "/ckpt", "--checkpoint-dir"); });
  std::filesystem::permissions(locked, std::filesystem::perms::owner_all);
  EXPECT_NE(message.find("cannot be created in " + locked), std::string::npos) << message;
}

}  // namespace
