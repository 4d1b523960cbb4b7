// Ranks under `ptrain launch` that were started differently: each stops before its first step with one
// error naming what differs, never an abort inside a collective or a run trained on silently.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "command.h"
#include "multiprocess.h"

namespace {

using ShellResult = ptrain::testing::CommandResult;

ShellResult shell_output(const std::string& command_line) { return ptrain::testing::run_command(command_line); }

const std::string kPtrain = PTRAIN_EXECUTABLE;
const std::string kRun = "train --model resnet20 --dataset synthetic --data-path 64:3x8x8:4 --batch-size 8 "
                         "--device cpu --threads 1 --progress none --max-steps 3 --test-limit 16 --dist-timeout 30";

// Two ranks under ptrain launch, each running `rank_setup` (shell, $RANK known) before kRun + extra.
ShellResult launch_two(const std::string& rank_setup, const std::string& extra = "") {
  return shell_output(kPtrain + " launch --nproc-per-node 2 --timeout 120 -- bash -c '" + rank_setup + "; exec " +
                   kPtrain + " " + kRun + " " + extra + "'");
}

TEST(Ranks, ThatDisagreeStopBeforeTheFirstStepNamingTheSetting) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  struct Case {
    std::string setup, expected;
  };
  const std::vector<Case> cases{
      // A stale variable on one node: silently another learning rate.
      {"export PTRAIN_STRATEGY=ddp; [ $RANK = 1 ] && export PTRAIN_LR=0.5",
       "ranks disagree on optimizer.lr (--lr): 0.1 on rank 0; 0.5 on rank 1"},
      {"export PTRAIN_STRATEGY=ddp; [ $RANK = 1 ] && export PTRAIN_SEED=7",
       "ranks disagree on run.seed (--seed): 0 on rank 0; 7 on rank 1"},
      // fp32 beside bf16 aborted inside gloo (exit 134) before the check.
      {"export PTRAIN_STRATEGY=ddp; [ $RANK = 1 ] && export PTRAIN_PRECISION=bf16",
       "ranks disagree on precision.precision (--precision): \"fp32\" on rank 0; \"bf16\" on rank 1"},
      {"export PTRAIN_STRATEGY=ddp; [ $RANK = 1 ] && export PTRAIN_STRATEGY=zero2",
       "ranks disagree on run.strategy (--strategy): \"ddp\" on rank 0; \"zero2\" on rank 1"},
  };
  for (const auto& c : cases) {
    const ShellResult r = launch_two(c.setup);
    EXPECT_EQ(r.exit_code, 2) << c.setup << "\n" << r.output;
    EXPECT_NE(r.output.find("ptrain: error: " + c.expected), std::string::npos) << c.expected << "\n" << r.output;
    EXPECT_EQ(r.output.find("result:"), std::string::npos) << r.output;
  }
  // Ranks that differ only in what each may hold for itself train together.
  const ShellResult same = launch_two("export PTRAIN_STRATEGY=ddp; [ $RANK = 1 ] && export PTRAIN_LOADER_THREADS=3; true");
  EXPECT_EQ(same.exit_code, 0) << same.output;
  EXPECT_NE(same.output.find("[rank 0] result:"), std::string::npos) << same.output;
}

TEST(Ranks, LaunchedWithoutAMultiProcessStrategyRefuse) {
  const ShellResult r = launch_two("true");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("ptrain: error: --strategy single trains in one process, but RANK="), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("WORLD_SIZE=2"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("result:"), std::string::npos) << r.output;
}

TEST(Ranks, TwoCpuRanksShareTheCoresAndRecordTheirThreads) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const std::string dir = ptrain::testing::temp_dir("ranks_threads");
  const std::string metrics = dir + "/run.json";
  // No --threads: the launcher's OMP_NUM_THREADS (the cores divided between the two ranks) decides.
  const std::string run = "train --model resnet20 --dataset synthetic --data-path 64:3x8x8:4 --batch-size 8 "
                          "--device cpu --progress lines --max-steps 2 --test-limit 16 --strategy ddp --dist-timeout 30";
  const ShellResult r = shell_output("env -u OMP_NUM_THREADS " + kPtrain + " launch --nproc-per-node 2 --timeout 120 -- " +
                             kPtrain + " " + run + " --log-all-ranks --metrics-out " + metrics);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const int64_t expected = std::max(1u, std::thread::hardware_concurrency() / 2);
  EXPECT_NE(r.output.find("ptrain launch: OMP_NUM_THREADS=" + std::to_string(expected)), std::string::npos) << r.output;
  for (const char* rank : {"[rank 0] ", "[rank 1] "})
    EXPECT_NE(r.output.find(rank + std::string("device cpu (") + std::to_string(expected) + " threads)"),
              std::string::npos)
        << r.output;
  const auto json = nlohmann::json::parse(std::ifstream(metrics));
  EXPECT_EQ(json["extra"]["config"]["run"]["threads"], expected) << json["extra"].dump();
}

// torchrun's habit: rank 0 alone prints the plan, progress and results; --log-all-ranks (flag or --config
// key) gives every rank its say again.
TEST(Ranks, OnlyRankZeroPrintsUnlessEveryRankIsAskedTo) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const std::string run = "train --model resnet20 --dataset synthetic --data-path 64:3x8x8:4 --batch-size 8 --device cpu "
                          "--threads 1 --progress lines --log-every 1 --max-steps 3 --test-limit 16 --dist-timeout 30 "
                          "--strategy ddp";
  const std::string launch = kPtrain + " launch --nproc-per-node 2 --timeout 120 -- " + kPtrain + " " + run;
  const ShellResult quiet = shell_output(launch);
  ASSERT_EQ(quiet.exit_code, 0) << quiet.output;
  for (const char* printed : {"[rank 0] model resnet20", "[rank 0] epoch 1/1 step 3/", "[rank 0] result: "})
    EXPECT_NE(quiet.output.find(printed), std::string::npos) << printed << "\n" << quiet.output;
  EXPECT_EQ(quiet.output.find("[rank 1]"), std::string::npos) << quiet.output;

  // An error on another rank still shows, with its rank.
  const ShellResult failed = launch_two("export PTRAIN_STRATEGY=ddp; [ $RANK = 1 ] && export PTRAIN_PRECISION=tf32; true");
  EXPECT_EQ(failed.exit_code, 2) << failed.output;
  EXPECT_NE(failed.output.find("[rank 1] ptrain: error: --precision tf32 needs a CUDA device"), std::string::npos)
      << failed.output;

  const std::string dir = ptrain::testing::temp_dir("ranks_log_all");
  std::ofstream(dir + "/all.yaml") << "log_all_ranks: true\n";
  for (const std::string& ask : {std::string(" --log-all-ranks"), " --config " + dir + "/all.yaml"}) {
    const ShellResult loud = shell_output(launch + ask);
    ASSERT_EQ(loud.exit_code, 0) << loud.output;
    for (const char* printed : {"[rank 0] model resnet20", "[rank 1] model resnet20", "[rank 1] epoch 1/1 step 3/"})
      EXPECT_NE(loud.output.find(printed), std::string::npos) << printed << "\n" << loud.output;
  }
}

}  // namespace
