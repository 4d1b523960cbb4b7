// Output paths are checked before a run starts, and nothing is created by the check.
#include "ptrain/io/output_path.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "ptrain/core/error.h"
#include "test_support.h"

namespace {

using ptrain::testing::error_message;
using ptrain::testing::TempDir;
using ptrain::testing::write_bytes;

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

// The message of body's ptrain::Error as an unprivileged user (root creates files in read-only directories);
// as root, in a child process that drops root, so that the tests go on as they started.
std::string message_without_root(const std::function<void()>& body) {
  if (::geteuid() != 0) return error_message<ptrain::Error>(body);
  int pipe_ends[2];
  if (::pipe(pipe_ends) != 0) return "no pipe";
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(pipe_ends[0]);
    std::string message = "no error";
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) {
      message = "cannot drop root";
    } else {
      try {
        body();
      } catch (const ptrain::Error& e) {
        message = e.what();
      }
    }
    ssize_t written = ::write(pipe_ends[1], message.data(), message.size());
    ::_exit(written < 0 ? 1 : 0);
  }
  ::close(pipe_ends[1]);
  std::string message;
  char chunk[512];
  for (ssize_t n; (n = ::read(pipe_ends[0], chunk, sizeof chunk)) > 0;) message.append(chunk, static_cast<size_t>(n));
  ::close(pipe_ends[0]);
  ::waitpid(child, nullptr, 0);
  return message;
}

// The OS's reason is the one of the failed attempt: it was read after errno was reset ("(Success)").
TEST(OutputPath, AReadOnlyDirectoryIsNamedWithTheOsReason) {
  TempDir dir;
  std::filesystem::permissions(dir.path(), std::filesystem::perms::owner_all | std::filesystem::perms::others_read |
                                               std::filesystem::perms::others_exec);
  const auto locked = dir.file("locked");
  std::filesystem::create_directories(locked);
  std::filesystem::permissions(locked, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec |
                                           std::filesystem::perms::others_read | std::filesystem::perms::others_exec);
  const std::string created =
      message_without_root([&] { ptrain::io::check_writable_directory(locked + "/ckpt", "--checkpoint-dir"); });
  const std::string itself = message_without_root([&] { ptrain::io::check_writable_directory(locked, "--tensorboard"); });
  const std::string file = message_without_root([&] { ptrain::io::check_writable_file(locked + "/m.json", "--metrics-out"); });
  std::filesystem::permissions(locked, std::filesystem::perms::owner_all);
  EXPECT_EQ(created, "--checkpoint-dir " + locked + "/ckpt: cannot be created in " + locked + " (Permission denied)");
  EXPECT_EQ(itself, "--tensorboard " + locked + ": is not writable (Permission denied)");
  EXPECT_EQ(file, "--metrics-out " + locked + "/m.json: cannot be created in " + locked + " (Permission denied)");
}

// /proc takes no new files, even from root: tried, not asked of access().
TEST(OutputPath, ADirectoryThatTakesNoFilesIsRefusedEvenForRoot) {
  const std::string message =
      error_message<ptrain::Error>([] { ptrain::io::check_writable_file("/proc/trace.json", "--profile-out"); });
  EXPECT_NE(message.find("--profile-out /proc/trace.json: cannot be created in /proc ("), std::string::npos) << message;
  EXPECT_EQ(message.find("Success"), std::string::npos) << message;
}

using Kind = ptrain::io::OutputPath::Kind;

std::string collision(const std::vector<ptrain::io::OutputPath>& outputs) {
  return error_message<ptrain::Error>([&] { ptrain::io::check_outputs(outputs); });
}

// --save-weights x.pt --metrics-out x.pt left the record where the weights were: refused, both flags named,
// however the one file is spelled.
TEST(OutputPath, TwoOutputsOnOneFileAreRefused) {
  TempDir dir;
  const auto weights = dir.file("x.pt");
  EXPECT_EQ(collision({{"--save-weights", weights, Kind::file}, {"--metrics-out", weights, Kind::file}}),
            "--save-weights " + weights + " and --metrics-out " + weights +
                " are one file: the second written would replace the first");
  std::filesystem::create_directories(dir.file("sub"));
  const auto spelled = dir.file("sub/../x.pt");
  EXPECT_NE(collision({{"--log-jsonl", weights, Kind::file}, {"--metrics-out", spelled, Kind::file}})
                .find("--log-jsonl " + weights + " and --metrics-out " + spelled + " are one file"),
            std::string::npos);
  write_bytes(weights, "weights");
  std::filesystem::create_symlink(weights, dir.file("link.json"));
  EXPECT_NE(collision({{"--save-weights", weights, Kind::file}, {"--metrics-out", dir.file("link.json"), Kind::file}})
                .find("are one file"),
            std::string::npos);
  std::filesystem::create_directory_symlink(dir.path(), dir.file("same_dir"));
  EXPECT_NE(collision({{"--save-weights", weights, Kind::file}, {"--metrics-out", dir.file("same_dir/x.pt"), Kind::file}})
                .find("are one file"),
            std::string::npos);
  EXPECT_NE(collision({{"--tensorboard", dir.file("tb"), Kind::directory}, {"--metrics-out", dir.file("tb"), Kind::file}})
                .find("are one path, used as a file and as a directory"),
            std::string::npos);
  EXPECT_NO_THROW(ptrain::io::check_outputs({{"--save-weights", weights, Kind::file},
                                             {"--metrics-out", dir.file("run.json"), Kind::file},
                                             {"--tensorboard", dir.file("tb"), Kind::directory},
                                             {"--profile-out", "", Kind::whole_file}}));
}

// The checkpoint directory's files are the checkpointer's: --save-weights there replaced the final checkpoint.
TEST(OutputPath, AFileInsideTheCheckpointDirectoryIsRefused) {
  TempDir dir;
  const auto checkpoints = dir.file("ck");
  for (const bool exists : {false, true}) {
    if (exists) std::filesystem::create_directories(checkpoints);
    EXPECT_EQ(collision({{"--checkpoint-dir", checkpoints, Kind::owned_directory},
                         {"--save-weights", checkpoints + "/step-00000008.safetensors", Kind::file}}),
              "--save-weights " + checkpoints + "/step-00000008.safetensors lies inside --checkpoint-dir " + checkpoints +
                  ", whose files the run creates and removes by name: put it elsewhere");
    EXPECT_NE(collision({{"--checkpoint-dir", checkpoints, Kind::owned_directory},
                         {"--tensorboard", checkpoints + "/tb", Kind::directory}})
                  .find("--tensorboard " + checkpoints + "/tb lies inside --checkpoint-dir"),
              std::string::npos);
    EXPECT_NE(collision({{"--checkpoint-dir", checkpoints, Kind::owned_directory},
                         {"--tensorboard", checkpoints + "/", Kind::directory}})
                  .find("are one directory; --checkpoint-dir must be a directory of its own"),
              std::string::npos);
  }
}

// Devices and streams are written in place: several outputs may share one, and the check opens none (a FIFO
// without a reader would wait). A file the profiler renames into place must be a regular file.
TEST(OutputPath, DevicesAndStreamsAreSharedAndCheckedWithoutOpening) {
  TempDir dir;
  const auto fifo = dir.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_NO_THROW(ptrain::io::check_outputs({{"--metrics-out", "/dev/null", Kind::file},
                                             {"--log-jsonl", "/dev/null", Kind::file},
                                             {"--save-weights", fifo, Kind::file},
                                             {"--json", "/dev/stderr", Kind::file}}));
  EXPECT_EQ(collision({{"--profile-out", "/dev/null", Kind::whole_file}}),
            "--profile-out /dev/null: must be a regular file, not a device, FIFO, socket or stream (it is written "
            "whole, then renamed into place)");
  const int read_only = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(read_only, 0);
  const std::string descriptor = "/proc/self/fd/" + std::to_string(read_only);
  EXPECT_EQ(collision({{"--metrics-out", descriptor, Kind::file}}),
            "--metrics-out " + descriptor + ": descriptor " + std::to_string(read_only) + " is open for reading only");
  ::close(read_only);
}

}  // namespace
