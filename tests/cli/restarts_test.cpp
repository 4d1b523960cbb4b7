// `ptrain launch --max-restarts`: a rank killed mid-run stops the job, which starts again from its newest
// checkpoint and ends on the weights of a run never interrupted; a usage error is not retried; without the
// flag a failure ends the job as it always did.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include <nlohmann/json.hpp>

#include "command.h"
#include "multiprocess.h"

namespace {

using Result = ptrain::testing::CommandResult;

const std::string kPtrain = PTRAIN_EXECUTABLE;
// Two ranks of 8 samples a step: 16 steps an epoch, 32 in all, a checkpoint every 4 (the newest two kept:
// the scratch directories stay behind after the test).
const std::string kRun = "train --model resnet20 --dataset synthetic --data-path 256:1x28x28:10 --batch-size 8 "
                         "--device cpu --threads 1 --progress none --strategy ddp --epochs 2 --warmup-epochs 0 "
                         "--test-limit 16 --dist-timeout 30 --seed 3 --checkpoint-every 4 --keep-checkpoints 2";
constexpr int kSteps = 32;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The command each rank runs: ptrain, except that on the job's first attempt rank 1 dies by SIGKILL (with
// its ptrain: the rank leads a process group of its own) at `when`: "now", or once a checkpoint of
// $CHECKPOINTS matching the pattern `when` is on disk ("step-*": the first, mid-run, 28 steps before the
// end; "step-00000032": the last). Each rank first prints which attempt the launcher says it is.
std::string rank_script(const std::string& dir) {
  const std::string path = dir + "/rank.sh";
  std::ofstream(path) << R"(when=$1; shift
echo "attempt ${PTRAIN_RESTART_COUNT-unset}"
if [ "$RANK" = 1 ] && [ "${PTRAIN_RESTART_COUNT:-0}" = 0 ]; then
  [ "$when" = now ] && kill -KILL 0
  "$@" &
  until compgen -G "$CHECKPOINTS/$when.safetensors" > /dev/null; do
    if ! kill -0 $! 2> /dev/null; then
      compgen -G "$CHECKPOINTS/$when.safetensors" > /dev/null && kill -KILL 0  # it ended just after writing it
      wait $!; exit $?
    fi
    sleep 0.01
  done
  kill -KILL 0
fi
exec "$@"
)";
  return path;
}

Result launch(const std::string& launch_flags, const std::string& rank_command, const std::string& checkpoints) {
  return ptrain::testing::run_command("CHECKPOINTS=" + checkpoints + " " + kPtrain +
                                      " launch --nproc-per-node 2 --timeout 300 " + launch_flags + " -- " + rank_command);
}

// The step of the checkpoint the restarted job said it resumed from; -1 when it said none.
int resumed_step(const std::string& output) {
  std::smatch match;
  static const std::regex pattern(R"(\[rank 0\] ptrain: restart 1 of the job \(rank 1 exited with signal 9 \(SIGKILL\)\): resuming from .*/step-(\d+)\.safetensors)");
  return std::regex_search(output, match, pattern) ? std::stoi(match[1]) : -1;
}

TEST(Restarts, AKilledRankRestartsTheJobFromItsCheckpointOnTheWeightsOfAnUninterruptedRun) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const std::string dir = ptrain::testing::temp_dir("restarts");
  const std::string script = rank_script(dir);
  const auto run_in = [&](const std::string& name) {
    std::filesystem::create_directories(dir + "/" + name);
    return kPtrain + " " + kRun + " --checkpoint-dir " + dir + "/" + name + "/checkpoints --save-weights " + dir + "/" +
           name + "/weights.safetensors --metrics-out " + dir + "/" + name + "/run.json";
  };
  const Result reference = launch("", run_in("reference"), dir + "/reference/checkpoints");
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const std::string want = read_bytes(dir + "/reference/weights.safetensors");
  ASSERT_FALSE(want.empty());

  // Killed once the first checkpoint exists: resumed from a checkpoint before the run's end.
  const Result killed = launch("--max-restarts 2", "bash " + script + " 'step-*' " + run_in("killed"),
                               dir + "/killed/checkpoints");
  ASSERT_EQ(killed.exit_code, 0) << killed.output;
  EXPECT_NE(killed.output.find("ptrain launch: restart 1 of 2: rank 1 exited with signal 9 (SIGKILL); stopped the "
                               "other ranks, starting every rank again"),
            std::string::npos)
      << killed.output;
  EXPECT_EQ(killed.output.find("restart 2 of 2"), std::string::npos) << killed.output;
  EXPECT_NE(killed.output.find("[rank 1] attempt 0\n"), std::string::npos) << killed.output;
  EXPECT_NE(killed.output.find("[rank 1] attempt 1\n"), std::string::npos) << killed.output;
  const int step = resumed_step(killed.output);
  EXPECT_GE(step, 4) << killed.output;
  EXPECT_LT(step, kSteps) << "the kill came after the run's end: " << killed.output;
  EXPECT_TRUE(read_bytes(dir + "/killed/weights.safetensors") == want) << "the restarted job's weights differ";
  const auto record = nlohmann::json::parse(std::ifstream(dir + "/killed/run.json"));
  const auto& end = record["extra"]["run_end"];
  EXPECT_EQ(end["status"], "completed") << end.dump();
  EXPECT_EQ(end["steps"], kSteps) << end.dump();
  EXPECT_EQ(end["restarts"], 1) << end.dump();
  EXPECT_EQ(end["restart_causes"], nlohmann::json::array({"rank 1 exited with signal 9 (SIGKILL)"})) << end.dump();
  const auto uninterrupted = nlohmann::json::parse(std::ifstream(dir + "/reference/run.json"));
  EXPECT_FALSE(uninterrupted["extra"]["run_end"].contains("restarts")) << uninterrupted["extra"]["run_end"].dump();

  // Killed before any checkpoint: the job starts again from the start, and ends the same.
  const Result early = launch("--max-restarts 1", "bash " + script + " now " + run_in("early"), dir + "/early/checkpoints");
  ASSERT_EQ(early.exit_code, 0) << early.output;
  EXPECT_NE(early.output.find("ptrain launch: restart 1 of 1: rank 1 exited with signal 9 (SIGKILL)"), std::string::npos)
      << early.output;
  EXPECT_NE(early.output.find("[rank 0] ptrain: restart 1 of the job (rank 1 exited with signal 9 (SIGKILL)): no "
                              "checkpoint in " + dir + "/early/checkpoints yet: training from the start"),
            std::string::npos)
      << early.output;
  EXPECT_TRUE(read_bytes(dir + "/early/weights.safetensors") == want) << "the restarted job's weights differ";

  // Killed once the last checkpoint exists: the training had ended, its evaluation and outputs are what the
  // restart has left to do.
  const Result late = launch("--max-restarts 1", "bash " + script + " step-000000" + std::to_string(kSteps) + " " +
                                                     run_in("late"),
                             dir + "/late/checkpoints");
  ASSERT_EQ(late.exit_code, 0) << late.output;
  EXPECT_EQ(resumed_step(late.output), kSteps) << late.output;
  EXPECT_NE(late.output.find("[rank 0] result: test accuracy"), std::string::npos) << late.output;
  EXPECT_TRUE(read_bytes(dir + "/late/weights.safetensors") == want) << "the restarted job's weights differ";
  const auto late_record = nlohmann::json::parse(std::ifstream(dir + "/late/run.json"));
  EXPECT_EQ(late_record["extra"]["run_end"]["status"], "completed") << late_record["extra"]["run_end"].dump();
  EXPECT_EQ(late_record["extra"]["run_end"]["restarts"], 1) << late_record["extra"]["run_end"].dump();
  EXPECT_EQ(late_record["final_test_accuracy"], uninterrupted["final_test_accuracy"]) << late_record.dump();
}

// Without --max-restarts the kill ends the job as it always did: the rank and its code named, no restart,
// and no restart variables for the ranks.
TEST(Restarts, WithoutMaxRestartsAKilledRankEndsTheJob) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const std::string dir = ptrain::testing::temp_dir("restarts_none");
  const Result r = launch("", "bash " + rank_script(dir) + " 'step-*' " + kPtrain + " " + kRun + " --checkpoint-dir " +
                                  dir + "/checkpoints",
                          dir + "/checkpoints");
  EXPECT_EQ(r.exit_code, 137) << r.output;
  EXPECT_NE(r.output.find("[rank 1] attempt unset\n"), std::string::npos) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(ptrain launch: rank 1 \(pid \d+\) exited with code 137; stopped the other ranks\n)")))
      << r.output;
  EXPECT_EQ(r.output.find("restart"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("result:"), std::string::npos) << r.output;
}

// A bad flag fails the same way every time: exit 2 is not retried, and the launcher says why.
TEST(Restarts, AUsageErrorIsNotRetried) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  // Rank 0's command is sound: it waits at the rendezvous until the launcher stops it.
  const std::string run = kPtrain + " " + kRun + " --checkpoint-dir " + ptrain::testing::temp_dir("restarts_usage");
  const Result r = ptrain::testing::run_command(
      kPtrain + " launch --nproc-per-node 2 --timeout 120 --max-restarts 2 -- bash -c 'echo attempt $PTRAIN_RESTART_COUNT; "
                "[ $RANK = 1 ] && exec " + run + " --no-such-flag; exec " + run + "'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("[rank 1] ptrain: error: ptrain train has no flag --no-such-flag"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ptrain launch: rank 1 (pid "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with code 2; stopped the other ranks; not restarting (--max-restarts 2): code 2 is a "
                          "usage error"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("[rank 1] attempt 0\n"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("attempt 1"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("restart 1"), std::string::npos) << r.output;
}

TEST(Restarts, ABadMaxRestartsIsRefusedNamingTheFlag) {
  const Result negative = ptrain::testing::run_command(kPtrain + " launch --max-restarts -1 -- true");
  EXPECT_EQ(negative.exit_code, 2) << negative.output;
  EXPECT_NE(negative.output.find("--max-restarts"), std::string::npos) << negative.output;
  const Result nodes = ptrain::testing::run_command(kPtrain + " launch --nnodes 2 --max-restarts 1 -- true");
  EXPECT_EQ(nodes.exit_code, 2) << nodes.output;
  EXPECT_NE(nodes.output.find("ptrain: error: launch: --max-restarts 1 restarts a job on one node only"),
            std::string::npos)
      << nodes.output;
}

}  // namespace
