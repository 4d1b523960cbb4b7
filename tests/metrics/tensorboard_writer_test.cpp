// The event files of --tensorboard and the JSON lines of --log-jsonl, read back by the test's own decoder
// (event_file_reader.h: its own CRC-32C and protobuf parsing, none of the writer's code).
#include "ptrain/metrics/scalar_log.h"
#include "ptrain/metrics/tensorboard_writer.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "event_file_reader.h"
#include "ptrain/core/error.h"
#include "remove_tree.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;
using ptrain::testing::read_event_file;

// A path for the writer to make, none there yet.
fs::path scratch(const std::string& name) { return ptrain::testing::named_scratch_path("tensorboard_" + name); }

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(entry.path());
  return files;
}

std::vector<nlohmann::json> json_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// CRC-32C's published check value (the CRC of "123456789"), for the writer's table and the test's bitwise loop.
TEST(TensorBoardWriter, Crc32cGivesTheCheckValue) {
  const std::string check = "123456789";
  EXPECT_EQ(ptrain::metrics::crc32c(check.data(), check.size()), 0xE3069283u);
  EXPECT_EQ(ptrain::testing::bitwise_crc32c(check), 0xE3069283u);
  const std::string text = "brain.Event:2 and some more bytes";
  EXPECT_EQ(ptrain::metrics::masked_crc32c(text.data(), text.size()), ptrain::testing::tfrecord_masked_crc(text));
}

TEST(TensorBoardWriter, FileStartsWithTheVersionEventAndHoldsTheScalarsAsLogged) {
  const auto dir = scratch("scalars") / "nested";
  {
    ptrain::metrics::TensorBoardWriter writer(dir.string(), "--tensorboard", 1700000000.25);
    const auto name = fs::path(writer.path()).filename().string();
    EXPECT_EQ(name.rfind("events.out.tfevents.1700000000.", 0), 0u) << name;
    writer.add_scalars(5, 1700000001.5, {{"train/loss", 2.25}, {"train/lr", 0.1}});
    writer.add_scalars(300, 1700000002.0, {{"train/loss", 0.5}, {"eval/accuracy", 0.875}, {"big", 123456789.0}});
  }
  const auto files = event_files(dir);
  ASSERT_EQ(files.size(), 1u);
  const auto events = read_event_file(files[0].string());
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_FALSE(events[0].has_summary);
  EXPECT_DOUBLE_EQ(events[0].wall_time, 1700000000.25);

  EXPECT_EQ(events[1].step, 5);
  EXPECT_DOUBLE_EQ(events[1].wall_time, 1700000001.5);
  ASSERT_EQ(events[1].scalars.size(), 2u);
  EXPECT_EQ(events[1].scalars[0].tag, "train/loss");
  EXPECT_EQ(events[1].scalars[0].value, 2.25f);
  EXPECT_EQ(events[1].scalars[1].tag, "train/lr");
  EXPECT_EQ(events[1].scalars[1].value, 0.1f);

  EXPECT_EQ(events[2].step, 300);  // a varint of two bytes
  ASSERT_EQ(events[2].scalars.size(), 3u);
  EXPECT_EQ(events[2].scalars[1].tag, "eval/accuracy");
  EXPECT_EQ(events[2].scalars[1].value, 0.875f);
  EXPECT_EQ(events[2].scalars[2].value, 123456789.0f);  // float32, as TensorBoard keeps it
  ptrain::testing::remove_tree(dir.parent_path());
}

// The reader's CRC checks are not idle: a flipped byte in a record's data or length is found.
TEST(TensorBoardWriter, ADamagedRecordFailsTheFramingCrc) {
  const auto dir = scratch("damaged");
  std::string path;
  {
    ptrain::metrics::TensorBoardWriter writer(dir.string(), "--tensorboard", 1700000000);
    writer.add_scalars(1, 1700000001, {{"train/loss", 1.0}});
    path = writer.path();
  }
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  for (const size_t at : {size_t{0}, size_t{14}, bytes.size() - 6}) {
    std::string damaged = bytes;
    damaged[at] ^= 0x01;
    std::ofstream(path, std::ios::binary | std::ios::trunc) << damaged;
    EXPECT_THROW(read_event_file(path), std::runtime_error) << "byte " << at;
  }
  ptrain::testing::remove_tree(dir);
}

// What was logged is in the files while the writer is still open: a run that crashes keeps it.
TEST(ScalarLog, EveryRecordIsOnDiskAsSoonAsItIsLogged) {
  const auto dir = scratch("flushed");
  const auto jsonl = dir / "logs" / "run.jsonl";
  ptrain::metrics::ScalarLog log((dir / "tb").string(), jsonl.string(), std::nullopt);
  log.log("step", 10, 0.5, {{"train/loss", 1.5}, {"train/lr", 0.05}});
  log.log("epoch", 20, 1.0, {{"eval/loss", 1.25}, {"eval/accuracy", 0.5}});

  const auto events = read_event_file(log.tensorboard_file());
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[1].step, 10);
  EXPECT_EQ(events[2].step, 20);
  EXPECT_EQ(events[2].scalars[0].tag, "eval/loss");
  EXPECT_EQ(events[2].scalars[0].value, 1.25f);

  const auto lines = json_lines(jsonl);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["kind"], "step");
  EXPECT_EQ(lines[0]["step"], 10);
  EXPECT_EQ(lines[0]["epoch"], 0.5);
  EXPECT_EQ(lines[0]["train/loss"], 1.5);  // JSON keeps the double
  EXPECT_EQ(lines[0]["train/lr"], 0.05);
  EXPECT_EQ(lines[1]["kind"], "epoch");
  EXPECT_EQ(lines[1]["eval/accuracy"], 0.5);
  // The same wall time in both outputs.
  EXPECT_DOUBLE_EQ(lines[0]["wall_time"].get<double>(), events[1].wall_time);
  EXPECT_GT(events[1].wall_time, 1.6e9);
  ptrain::testing::remove_tree(dir);
}

// A resumed run continues the JSON lines after its checkpoint's step, dropping what an earlier run logged
// past it, and tells TensorBoard to do the same (a SessionLog START at the next step).
TEST(ScalarLog, AResumedRunReplacesWhatWasLoggedAfterItsCheckpoint) {
  const auto dir = scratch("resumed");
  const auto jsonl = dir / "run.jsonl";
  {
    ptrain::metrics::ScalarLog first((dir / "tb").string(), jsonl.string(), std::nullopt);
    for (const int64_t step : {2, 4, 6}) first.log("step", step, step / 8.0, {{"train/loss", 1.0 / step}});
  }
  {
    std::ofstream(jsonl, std::ios::app) << "{\"kind\": \"step\", \"st";  // a line cut short by a kill
  }
  ptrain::metrics::ScalarLog resumed((dir / "tb").string(), jsonl.string(), 4);
  resumed.log("step", 6, 0.75, {{"train/loss", 0.125}});
  const auto lines = json_lines(jsonl);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["step"], 2);
  EXPECT_EQ(lines[1]["step"], 4);
  EXPECT_EQ(lines[2]["step"], 6);
  EXPECT_EQ(lines[2]["train/loss"], 0.125);

  const auto files = event_files(dir / "tb");
  ASSERT_EQ(files.size(), 2u) << "the resumed run writes a file of its own";
  const auto events = read_event_file(resumed.tensorboard_file());
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_EQ(events[1].session_log_status, 1) << "SessionLog.START";
  EXPECT_EQ(events[1].step, 5);
  EXPECT_EQ(events[2].step, 6);
  ptrain::testing::remove_tree(dir);
}

TEST(ScalarLog, AFreshRunStartsTheJsonLinesAnew) {
  const auto dir = scratch("fresh");
  const auto jsonl = dir / "run.jsonl";
  {
    ptrain::metrics::ScalarLog first("", jsonl.string(), std::nullopt);
    first.log("step", 1, 0.1, {{"train/loss", 3.0}});
    EXPECT_TRUE(first.tensorboard_file().empty());
  }
  ptrain::metrics::ScalarLog second("", jsonl.string(), std::nullopt);
  second.log("step", 1, 0.1, {{"train/loss", 2.0}});
  const auto lines = json_lines(jsonl);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["train/loss"], 2.0);
  EXPECT_FALSE(fs::exists(dir / "tb"));
  ptrain::testing::remove_tree(dir);
}

TEST(ScalarLog, AnOutputThatCannotBeCreatedIsNamedWithItsFlag) {
  const auto dir = scratch("blocked");
  fs::create_directories(dir);
  std::ofstream(dir / "file") << "x";
  try {
    ptrain::metrics::ScalarLog log((dir / "file" / "tb").string(), "", std::nullopt);
    FAIL() << "a directory under a file was created";
  } catch (const ptrain::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--tensorboard " + (dir / "file" / "tb").string() + ": ", 0), 0u) << e.what();
  }
  try {
    ptrain::metrics::ScalarLog log("", (dir / "file" / "run.jsonl").string(), std::nullopt);
    FAIL() << "a file under a file was created";
  } catch (const ptrain::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--log-jsonl " + (dir / "file" / "run.jsonl").string() + ": ", 0), 0u)
        << e.what();
  }
  ptrain::testing::remove_tree(dir);
}

// Logs are auxiliary: /dev/full (written in place, every write failing with ENOSPC) costs the run its JSON
// lines and one warning naming the file and the reason, never the run.
TEST(ScalarLog, AFullDiskUnderTheJsonLinesWarnsOnceAndTheRunGoesOn) {
  ptrain::metrics::ScalarLog log("", "/dev/full", std::nullopt);
  ::testing::internal::CaptureStderr();
  for (int64_t step = 1; step <= 3; ++step) EXPECT_NO_THROW(log.log("step", step, 0.1 * step, {{"train/loss", 1.0}}));
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(warnings,
            "ptrain: warning: --log-jsonl /dev/full: cannot write (No space left on device); training goes on without "
            "this log\n");
  EXPECT_EQ(log.failed(), std::vector<std::string>{"--log-jsonl"});
}

// A disk that fills up while a run trains (a file-size limit stands in for it: writes past it fail with
// EFBIG): each log warns once and is given up, what it logged before stays, the other goes on.
TEST(ScalarLog, ADiskThatFillsUpMidRunCostsTheLogsNotTheRun) {
  const auto dir = scratch("full");
  fs::create_directories(dir);
  struct rlimit before {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &before), 0);
  const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
  std::string warnings;
  std::vector<std::string> failed;
  {
    ptrain::metrics::ScalarLog log((dir / "tb").string(), (dir / "log.jsonl").string(), std::nullopt);
    struct rlimit small = before;
    // The first records fit; then neither file may grow. (Also gtest's capture file: the warnings fit.)
    small.rlim_cur = 1000;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    ::testing::internal::CaptureStderr();
    for (int64_t step = 1; step <= 60; ++step) log.log("step", step, 0.05 * step, {{"train/loss", 1.0 / step}});
    warnings = ::testing::internal::GetCapturedStderr();
    ::setrlimit(RLIMIT_FSIZE, &before);
    failed = log.failed();
  }
  std::signal(SIGXFSZ, previous_handler);
  EXPECT_EQ(failed.size(), 2u) << warnings;
  EXPECT_NE(warnings.find("ptrain: warning: --log-jsonl " + (dir / "log.jsonl").string() + ": cannot write (File too large)"),
            std::string::npos) << warnings;
  EXPECT_NE(warnings.find("ptrain: warning: --tensorboard: cannot write the TensorBoard event file " + (dir / "tb").string()),
            std::string::npos) << warnings;
  std::ifstream in(dir / "log.jsonl");
  int complete = 0;  // the last line may be cut where the disk filled
  for (std::string line; std::getline(in, line);) complete += nlohmann::json::parse(line, nullptr, false).is_object();
  EXPECT_GE(complete, 5);
  ptrain::testing::remove_tree(dir);
}

}  // namespace
