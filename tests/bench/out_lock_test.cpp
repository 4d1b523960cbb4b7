// Two benches given one --out: the second is refused before it reads or writes anything there, naming the
// directory and the bench holding it. flock(2) locks belong to an open file, so a lock taken here and a
// bench run here conflict exactly as two bench processes do.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "ptrain/bench/out_lock.h"
#include "ptrain/bench/runner.h"
#include "ptrain/core/error.h"
#include "test_support.h"

namespace ptrain::bench {
namespace {

using ptrain::testing::TempDir;
namespace fs = std::filesystem;

TEST(OutDirectoryLock, ASecondBenchOnOneOutIsRefusedNamingTheDirectoryAndTheHolder) {
  TempDir dir;
  const std::string out = dir.file("out");
  fs::create_directories(out);
  std::ofstream(dir.file("suite.yaml")) << "name: other\nworkload: {model: resnet20, dataset: synthetic, data-path: "
                                           "\"64:1x8x8:4\", batch-size: 8, max-steps: 1}\nruns:\n  - {precision: fp32}\n";
  BenchOptions o;
  o.suite = dir.file("suite.yaml");
  o.source_dir = PTRAIN_SOURCE_DIR;
  o.out_dir = out;
  o.gpus = 0;
  o.estimate = false;
  o.ptrain_executable = "/bin/false";
  std::ostringstream progress;
  {
    const OutDirectoryLock first_bench(out);
    const std::string message = ptrain::testing::error_message<Error>([&] { run_bench(o, progress); });
    EXPECT_EQ(message.rfind("--out " + out + " is in use by another ptrain bench (pid " + std::to_string(::getpid()) +
                                " on ",
                            0),
              0u)
        << message;
    EXPECT_NE(message.find("another --out"), std::string::npos) << message;
    // Refused before it wrote its workload over the first bench's.
    EXPECT_FALSE(fs::exists(out + "/workload.yaml"));
    EXPECT_FALSE(fs::exists(out + "/bench.json"));
  }
  // Released with its holder: the directory is free again.
  EXPECT_NO_THROW(OutDirectoryLock{out});
}

}  // namespace
}  // namespace ptrain::bench
