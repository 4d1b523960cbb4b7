#include "ptrain/io/atomic_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "ptrain/core/error.h"
#include "ptrain/io/chunks.h"
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

// Pieces of 256 MiB or more are written by several threads at their offsets (a checkpoint's tensors): the file
// holds them in order, byte for byte, pieces of odd sizes straddling the writers' 64 MiB chunks included, and
// what a sequential write would have left; a file replaced by a shorter one keeps none of its old tail.
TEST(AtomicFile, ManyPiecesOfALargeFileAreWrittenInOrder) {
  TempDir dir;
  const auto path = dir.file("large.bin");
  std::string data(size_t{300} << 20, '\0');
  uint32_t state = 12345;
  for (size_t i = 0; i < data.size(); i += 4) {
    state = state * 1664525u + 1013904223u;  // distinct bytes everywhere: a chunk at the wrong offset shows
    std::memcpy(&data[i], &state, std::min<size_t>(4, data.size() - i));
  }
  const std::string_view all(data);
  const std::vector<std::string_view> pieces{all.substr(0, 7), all.substr(7, (size_t{100} << 20) + 3),
                                             all.substr((size_t{100} << 20) + 10)};
  ptrain::io::write_file_atomically(path, pieces);
  const std::string written = read_bytes(path);
  ASSERT_EQ(written.size(), data.size());
  EXPECT_TRUE(written == data) << "the pieces are not where a sequential write puts them";
  ptrain::io::write_file_atomically(path, std::string("short"));
  EXPECT_EQ(read_bytes(path), "short");
  EXPECT_EQ(entries_in(dir.path()), 1u) << "a temporary file was left behind";
}

// A head that depends on the body (a checksum of it): every chunk of a body of 300 MiB (threads at their
// offsets) is visited once, by the thread writing it, with the bytes chunks_of gives it; head() runs after the
// last visit and lands at the start; the body follows it in order.
TEST(AtomicFile, ABodyIsVisitedChunkByChunkAndItsHeadWrittenLast) {
  TempDir dir;
  const auto path = dir.file("large.bin");
  std::string data(size_t{300} << 20, '\0');
  for (size_t i = 0; i < data.size(); i += 4096) data[i] = static_cast<char>(i / 4096 % 251);
  const std::string_view all(data);
  ptrain::io::BodyThenHead file;
  file.body = {all.substr(0, 5), all.substr(5)};
  const auto chunks = ptrain::io::chunks_of(file.body);
  ASSERT_GT(chunks.size(), 4u);
  std::vector<std::atomic<int>> visits(chunks.size());
  std::atomic<size_t> sum{0};
  file.visit_chunk = [&](size_t i, std::string_view chunk) {
    ASSERT_LT(i, chunks.size());
    EXPECT_EQ(chunk.data(), chunks[i].data());
    EXPECT_EQ(chunk.size(), chunks[i].size());
    ++visits[i];
    size_t bytes = 0;
    for (size_t at = 0; at < chunk.size(); at += 4096) bytes += static_cast<unsigned char>(chunk[at]);
    sum += bytes;
  };
  std::string expected_head;
  file.head_bytes = 16;
  file.head = [&] {
    for (size_t i = 0; i < visits.size(); ++i) EXPECT_EQ(visits[i].load(), 1) << "chunk " << i << " before the head";
    char text[17];
    std::snprintf(text, sizeof text, "%016zx", sum.load());
    return expected_head = text;
  };
  ptrain::io::write_file_atomically(path, file);
  const std::string written = read_bytes(path);
  ASSERT_EQ(written.size(), 16 + data.size());
  EXPECT_EQ(written.substr(0, 16), expected_head);
  EXPECT_TRUE(written.compare(16, std::string::npos, data) == 0) << "the body is not where a sequential write puts it";
  EXPECT_EQ(entries_in(dir.path()), 1u) << "a temporary file was left behind";
}

// A head of the wrong length would shift the body under it: refused, naming the file, the old file kept. A
// visit that throws (a copy to host memory that failed) leaves the old file too.
TEST(AtomicFile, AHeadOfAnotherLengthOrAFailedVisitLeavesTheOldFile) {
  TempDir dir;
  const auto path = dir.file("checkpoint.bin");
  write_bytes(path, "old contents");
  const std::string body = "body";
  ptrain::io::BodyThenHead file;
  file.body = {body};
  file.head_bytes = 4;
  file.head = [] { return std::string("12345"); };
  auto message = error_message<ptrain::Error>([&] { ptrain::io::write_file_atomically(path, file); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("5 bytes"), std::string::npos) << message;
  EXPECT_EQ(read_bytes(path), "old contents");
  file.head = [] { return std::string("1234"); };
  file.visit_chunk = [](size_t, std::string_view) { throw ptrain::Error("the copy to host memory failed"); };
  message = error_message<ptrain::Error>([&] { ptrain::io::write_file_atomically(path, file); });
  EXPECT_NE(message.find("the copy to host memory failed"), std::string::npos) << message;
  EXPECT_EQ(read_bytes(path), "old contents");
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

struct stat stat_of(const std::string& path) {
  struct stat status {};
  EXPECT_EQ(::stat(path.c_str(), &status), 0) << path;
  return status;
}

// A FIFO is written where it is (its reader gets the bytes), never replaced by a regular file.
TEST(AtomicFile, AFifoIsWrittenInPlace) {
  TempDir dir;
  const auto fifo = dir.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  ASSERT_TRUE(ptrain::io::output_target(fifo).in_place);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // so that opening it for writing does not wait
  ASSERT_GE(reader, 0);
  ptrain::io::write_file_atomically(fifo, "{\"steps\": 8}\n");
  // A head known after the body: the body visited first, then head and body go through in order.
  ptrain::io::BodyThenHead file;
  file.body = {"body\n"};
  file.head_bytes = 5;
  bool visited = false;
  file.visit_chunk = [&](size_t, std::string_view) { visited = true; };
  file.head = [&] { return std::string(visited ? "head " : "early"); };
  ptrain::io::write_file_atomically(fifo, file);
  char buffer[64] = {};
  const ssize_t n = ::read(reader, buffer, sizeof buffer);
  ::close(reader);
  EXPECT_EQ(std::string(buffer, n > 0 ? static_cast<size_t>(n) : 0), "{\"steps\": 8}\nhead body\n");
  EXPECT_TRUE(S_ISFIFO(stat_of(fifo).st_mode)) << "the FIFO was replaced";
  EXPECT_EQ(entries_in(dir.path()), 1u) << "a temporary file was left behind";
}

// /proc/self/fd/N and /dev/fd/N of a log a shell opened (`ptrain train > log`): the log keeps what was
// printed before, the bytes follow it, and it stays the same file (not one renamed over it).
TEST(AtomicFile, AProcesssOwnStreamIsAppendedToNotReplaced) {
  TempDir dir;
  const auto log = dir.file("log");
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "progress\n", 9), 9);
  const ino_t inode = stat_of(log).st_ino;
  for (const std::string& name : {"/proc/self/fd/" + std::to_string(fd), "/dev/fd/" + std::to_string(fd)}) {
    const auto target = ptrain::io::output_target(name);
    ASSERT_TRUE(target.in_place) << name;
    EXPECT_EQ(target.descriptor, fd) << name;
    ptrain::io::write_file_atomically(name, "record\n");
  }
  ::close(fd);
  EXPECT_EQ(read_bytes(log), "progress\nrecord\nrecord\n");
  EXPECT_EQ(stat_of(log).st_ino, inode) << "the log was replaced";
  EXPECT_EQ(ptrain::io::output_target("/dev/stdout").descriptor, 1);
  EXPECT_EQ(ptrain::io::output_target("/dev/stderr").descriptor, 2);
}

// A stream that is a socket cannot be opened by name: it is written through the descriptor.
TEST(AtomicFile, ADescriptorOnASocketIsWrittenThroughIt) {
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  ptrain::io::write_file_atomically("/proc/self/fd/" + std::to_string(pair[0]), "over a socket");
  char buffer[64] = {};
  const ssize_t n = ::read(pair[1], buffer, sizeof buffer);
  ::close(pair[0]);
  ::close(pair[1]);
  EXPECT_EQ(std::string(buffer, n > 0 ? static_cast<size_t>(n) : 0), "over a socket");
}

// Devices stay devices; /dev/full's ENOSPC is an error naming the path and the OS's reason.
TEST(AtomicFile, DevicesAreWrittenInPlaceAndTheirErrorsNamed) {
  // Checked first: written atomically, these would be replaced by regular files.
  ASSERT_TRUE(ptrain::io::output_target("/dev/null").in_place);
  ASSERT_TRUE(ptrain::io::output_target("/dev/full").in_place);
  ptrain::io::write_file_atomically("/dev/null", "discarded");
  EXPECT_TRUE(S_ISCHR(stat_of("/dev/null").st_mode));
  const std::string full =
      error_message<ptrain::Error>([] { ptrain::io::write_file_atomically("/dev/full", "no room"); });
  EXPECT_EQ(full, "cannot write /dev/full: No space left on device");
  EXPECT_TRUE(S_ISCHR(stat_of("/dev/full").st_mode));
}

}  // namespace
