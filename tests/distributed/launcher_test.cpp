#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "multiprocess.h"
#include "ptrain/core/error.h"
#include "ptrain/distributed/cpu_threads.h"
#include "ptrain/distributed/launcher.h"

namespace ptrain::distributed {
namespace {

struct Captured {
  int code;
  std::string out;
  std::string err;
  double seconds;
};

Captured run_launch(LaunchOptions options) {
  const std::string dir = testing::temp_dir("launch");
  const int out_fd = ::open((dir + "/out").c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
  const int err_fd = ::open((dir + "/err").c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
  options.stdout_fd = out_fd;
  options.stderr_fd = err_fd;
  const auto start = std::chrono::steady_clock::now();
  const int code = launch(options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::close(out_fd);
  ::close(err_fd);
  return {code, testing::read_text(dir + "/out"), testing::read_text(dir + "/err"), seconds};
}

TEST(Launcher, SetsTheEnvironmentAndPrefixesLines) {
  LaunchOptions o;
  o.nproc_per_node = 3;
  o.allow_oversubscribe = true;  // three ranks whatever the machine's cores
  o.nnodes = 2;
  o.node_rank = 1;
  o.master_addr = "10.1.2.3";
  o.master_port = 31234;
  o.command = {"sh", "-c",
               "echo \"env $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT\"; "
               "printf 'two\\nlines\\n'; printf 'no newline'; echo oops >&2"};
  const auto r = run_launch(o);
  EXPECT_EQ(r.code, 0) << r.err;
  for (int local = 0; local < 3; ++local) {
    const std::string p = "[rank " + std::to_string(3 + local) + "] ";
    EXPECT_NE(r.out.find(p + "env " + std::to_string(3 + local) + " " + std::to_string(local) +
                         " 6 3 1 10.1.2.3 31234\n"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find(p + "two\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(p + "lines\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(p + "no newline\n"), std::string::npos) << r.out;
    EXPECT_NE(r.err.find(p + "oops\n"), std::string::npos) << r.err;
  }
  // Every line carries a prefix.
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) EXPECT_EQ(line.rfind("[rank ", 0), 0u) << line;
}

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

TEST(Launcher, FailingRankStopsTheOthersQuickly) {
  const std::string dir = testing::temp_dir("launch_fail");
  LaunchOptions o;
  o.nproc_per_node = 3;
  o.allow_oversubscribe = true;
  o.kill_grace_seconds = 1;
  // Every rank records its shell's pid and that of a background sleeper (a grandchild); rank 1 fails.
  o.command = {"sh", "-c",
               "sleep 60 & echo $! > " + dir + "/child$RANK; echo $$ > " + dir + "/pid$RANK; "
               "if [ \"$RANK\" = 1 ]; then sleep 0.5; exit 3; fi; wait"};
  const auto r = run_launch(o);
  EXPECT_EQ(r.code, 3);
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_NE(r.err.find("rank 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("code 3"), std::string::npos) << r.err;
  for (int rank = 0; rank < 3; ++rank) {
    for (const std::string kind : {"pid", "child"}) {
      const std::string text = testing::read_text(dir + "/" + kind + std::to_string(rank));
      ASSERT_FALSE(text.empty()) << kind << rank;
      const pid_t pid = std::stoi(text);
      // Reaped children are gone; the sleepers were re-parented and may need a moment to be reaped.
      for (int i = 0; i < 100 && alive(pid); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      EXPECT_FALSE(alive(pid)) << kind << " of rank " << rank << " (pid " << pid << ") survived";
    }
  }
}

TEST(Launcher, RankIgnoringSigtermIsKilledAfterGrace) {
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.kill_grace_seconds = 1;
  o.command = {"sh", "-c", "if [ \"$RANK\" = 0 ]; then exit 1; fi; trap '' TERM; while true; do sleep 0.1; done"};
  const auto r = run_launch(o);
  EXPECT_EQ(r.code, 1);
  EXPECT_LT(r.seconds, 8.0);
  EXPECT_NE(r.err.find("rank 0"), std::string::npos) << r.err;
}

TEST(Launcher, JobTimeoutStopsEveryRank) {
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.timeout_seconds = 1;
  o.kill_grace_seconds = 1;
  o.command = {"sleep", "30"};
  const auto r = run_launch(o);
  EXPECT_NE(r.code, 0);
  EXPECT_LT(r.seconds, 8.0);
  EXPECT_NE(r.err.find("--timeout"), std::string::npos) << r.err;
}

TEST(Launcher, RejectsBadOptionsAndMissingPrograms) {
  LaunchOptions o;
  EXPECT_THROW(launch(o), Error);  // no command
  o.command = {"true"};
  o.nproc_per_node = 0;
  EXPECT_THROW(launch(o), Error);
  o.nproc_per_node = 1;
  o.node_rank = 2;
  EXPECT_THROW(launch(o), Error);
  o.node_rank = 0;
  o.master_port = -1;  // 0 asks for a free one
  EXPECT_THROW(launch(o), Error);
  o.master_port = 0;
  o.command = {"/nonexistent/ptrain-no-such-program"};
  try {
    launch(o);
    FAIL() << "a missing program must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ptrain-no-such-program"), std::string::npos) << e.what();
  }
}

// Two ranks on any machine (a 1-core CI runner too), stopped 1 s after a failure.
LaunchOptions two_ranks_quick_to_stop() {
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.allow_oversubscribe = true;
  o.kill_grace_seconds = 1;
  return o;
}

// --max-restarts: a failed rank (by its exit code or a signal) stops every rank and starts the job again,
// which learns its attempt and the causes so far from the environment, as torchrun's TORCHELASTIC_RESTART_COUNT.
TEST(Launcher, RestartsTheJobAfterAFailedRankTellingTheRanksWhy) {
  const std::string dir = testing::temp_dir("restarts");
  LaunchOptions o = two_ranks_quick_to_stop();
  o.max_restarts = 2;
  o.command = {"sh", "-c",
               "echo \"attempt $PTRAIN_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS "
               "causes [$PTRAIN_RESTART_CAUSES]\"; "
               // Both ranks have spoken before one fails (the launcher stops the other then).
               "touch " + dir + "/a$PTRAIN_RESTART_COUNT.$RANK; "
               "while [ ! -e " + dir + "/a$PTRAIN_RESTART_COUNT.0 ] || [ ! -e " + dir + "/a$PTRAIN_RESTART_COUNT.1 ]; "
               "do sleep 0.01; done; "
               "if [ \"$PTRAIN_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 1 ]; then exit 3; fi; "
               "if [ \"$PTRAIN_RESTART_COUNT\" = 1 ] && [ \"$RANK\" = 0 ]; then kill -KILL $$; fi"};
  const auto r = run_launch(o);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("ptrain launch: restart 1 of 2: rank 1 exited with code 3; "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ptrain launch: restart 2 of 2: rank 0 exited with signal 9 (SIGKILL); "), std::string::npos)
      << r.err;
  for (const char* rank : {"[rank 0] ", "[rank 1] "}) {
    EXPECT_NE(r.out.find(rank + std::string("attempt 0 0 of 2 causes []\n")), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(rank + std::string("attempt 1 1 of 2 causes [rank 1 exited with code 3]\n")), std::string::npos)
        << r.out;
    // One line a cause: the launcher prefixes each line of the rank's output.
    EXPECT_NE(r.out.find(rank + std::string("attempt 2 2 of 2 causes [rank 1 exited with code 3\n") + rank +
                         "rank 0 exited with signal 9 (SIGKILL)]\n"),
              std::string::npos)
        << r.out;
  }
  EXPECT_EQ(r.out.find("attempt 3"), std::string::npos) << r.out;
}

TEST(Launcher, GivesUpAfterMaxRestartsWithTheLastFailure) {
  LaunchOptions o = two_ranks_quick_to_stop();
  o.max_restarts = 1;
  o.command = {"sh", "-c", "echo attempt $PTRAIN_RESTART_COUNT; if [ \"$RANK\" = 1 ]; then exit 4; fi"};
  const auto r = run_launch(o);
  EXPECT_EQ(r.code, 4);
  EXPECT_NE(r.err.find("ptrain launch: restart 1 of 1: rank 1 exited with code 4; "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with code 4; stopped the other ranks; gave up after 1 restart (--max-restarts 1)\n"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("[rank 1] attempt 1\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("attempt 2"), std::string::npos) << r.out;
}

// Exit code 2 is ptrain's (and argparse's) usage error: a restart would only meet it again.
TEST(Launcher, DoesNotRetryAUsageError) {
  LaunchOptions o = two_ranks_quick_to_stop();
  o.max_restarts = 2;
  o.command = {"sh", "-c", "echo attempt $PTRAIN_RESTART_COUNT; if [ \"$RANK\" = 1 ]; then exit 2; fi; exec sleep 30"};
  const auto r = run_launch(o);
  EXPECT_EQ(r.code, 2);
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_NE(r.err.find("rank 1 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with code 2; stopped the other ranks; not restarting (--max-restarts 2): code 2 is a "
                       "usage error"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("restart 1"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("attempt 1"), std::string::npos) << r.out;
}

// Without --max-restarts the job is today's: no restart variables, the first failure ends it.
TEST(Launcher, WithoutMaxRestartsAFailureEndsTheJob) {
  LaunchOptions o = two_ranks_quick_to_stop();
  o.command = {"sh", "-c", "echo \"restarts ${PTRAIN_RESTART_COUNT-unset} ${TORCHELASTIC_RESTART_COUNT-unset}\"; "
                           "if [ \"$RANK\" = 1 ]; then kill -KILL $$; fi; exec sleep 30"};
  const auto r = run_launch(o);
  EXPECT_EQ(r.code, 128 + SIGKILL);
  EXPECT_NE(r.out.find("[rank 1] restarts unset unset\n"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("ptrain launch: rank 1 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(") exited with code 137; stopped the other ranks\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("restart"), std::string::npos) << r.err;
}

TEST(Launcher, RefusesBadMaxRestarts) {
  LaunchOptions o;
  o.command = {"true"};
  o.max_restarts = -1;
  EXPECT_THROW(launch(o), Error);
  o.max_restarts = 2;
  o.nnodes = 2;
  try {
    launch(o);
    FAIL() << "--max-restarts across nodes must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--max-restarts 2 restarts a job on one node only"), std::string::npos)
        << e.what();
  }
}

// SIGTERM to the launcher stops the job for good, even when a rank fails at the same moment.
TEST(Launcher, SigtermStopsARestartableJobWithoutRestartingIt) {
  const std::string dir = testing::temp_dir("restart_sigterm");
  const pid_t launcher = ::fork();
  if (launcher == 0) {
    LaunchOptions o;
    o.nproc_per_node = 2;
    o.allow_oversubscribe = true;
    o.kill_grace_seconds = 1;
    o.max_restarts = 2;
    o.command = {"sh", "-c", "touch " + dir + "/attempt$PTRAIN_RESTART_COUNT; "
                             "if [ \"$RANK\" = 1 ]; then kill -TERM $PPID; exit 3; fi; exec sleep 30"};
    const int err = ::open((dir + "/err").c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
    const int devnull = ::open("/dev/null", O_WRONLY);
    o.stdout_fd = devnull;
    o.stderr_fd = err;
    ::_exit(launch(o));
  }
  int status = 0;
  ASSERT_EQ(::waitpid(launcher, &status, 0), launcher);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
  const std::string err = testing::read_text(dir + "/err");
  EXPECT_NE(err.find("received SIGTERM"), std::string::npos) << err;
  EXPECT_EQ(err.find("restart 1"), std::string::npos) << err;
  EXPECT_TRUE(std::filesystem::exists(dir + "/attempt0"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/attempt1")) << err;
}

// A process that exited but was not reaped yet counts as gone.
bool running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  const auto paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] != 'Z';
}

// Reaps what comes to this process while it waits up to 5 s for every rank to be gone; a rank still running
// fails the test and is killed, so that it outlives no test.
void expect_gone_within_5_seconds(const std::vector<pid_t>& ranks, const std::string& outlived) {
  const auto gone_by = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  bool any = true;
  while (any && std::chrono::steady_clock::now() < gone_by) {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    any = std::any_of(ranks.begin(), ranks.end(), running);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const pid_t pid : ranks) {
    EXPECT_FALSE(running(pid)) << "rank pid " << pid << " outlived " << outlived;
    if (running(pid)) ::kill(pid, SIGKILL);
  }
}

// More processes than the node has cores (or GPUs, for a job on GPUs) are refused before any starts, naming
// what set the count and the bound, unless oversubscription is asked for.
TEST(Launcher, RefusesMoreProcessesThanCoresOrGpusUnlessAllowed) {
  LaunchOptions o;
  o.command = {"true"};
  o.hardware_threads = 2;
  o.visible_gpus = 0;
  o.nproc_per_node = 1500;
  const auto refusal = [&]() -> std::string {
    try {
      launch(o);
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected a refusal";
    return "";
  };
  std::string message = refusal();
  EXPECT_NE(message.find("--nproc-per-node 1500 is more processes than this node's 2 cores (at most 2)"), std::string::npos)
      << message;
  EXPECT_NE(message.find("--allow-oversubscribe"), std::string::npos) << message;

  o.nproc_per_node = 100000;
  o.nproc_source = "accelerate.yaml: key 'num_processes'";
  message = refusal();
  EXPECT_NE(message.find("accelerate.yaml: key 'num_processes' 100000 is more processes than this node's 2 cores"),
            std::string::npos) << message;

  // A job on GPUs: one process a GPU; the same job put on the CPU by its --device is bounded by the cores.
  o.nproc_source = "--nproc-per-node";
  o.nproc_per_node = 3;
  o.visible_gpus = 2;
  o.hardware_threads = 64;
  message = refusal();
  EXPECT_NE(message.find("--nproc-per-node 3 is more processes than this node's 2 visible GPUs"), std::string::npos)
      << message;
  o.command = {"true", "--device", "cpu"};
  EXPECT_EQ(node_capacity(o).processes, 64);
  EXPECT_EQ(node_capacity(o).what, "64 cores");
  // Or by its --config file's device key; a --device in the command or
  // PTRAIN_DEVICE wins over the file, as in the ranks.
  o.command = {"true"};
  o.config_device = "cpu";
  EXPECT_EQ(node_capacity(o).what, "64 cores");
  o.command = {"true", "--device=cuda:0"};
  EXPECT_EQ(node_capacity(o).what, "2 visible GPUs");
  // So does PTRAIN_DEVICE, which the ranks read before the file.
  o.command = {"true"};
  const char* before = std::getenv("PTRAIN_DEVICE");
  const std::string saved = before ? before : "";
  ::setenv("PTRAIN_DEVICE", "cuda", 1);
  EXPECT_EQ(node_capacity(o).what, "2 visible GPUs");
  if (before) ::setenv("PTRAIN_DEVICE", saved.c_str(), 1); else ::unsetenv("PTRAIN_DEVICE");
  o.config_device = "";

  o.command = {"true"};
  o.allow_oversubscribe = true;
  EXPECT_EQ(run_launch(o).code, 0);
}

// A signal while ranks are still starting stops the start: the launcher starts no more, stops the ones
// started and exits with the signal's code, promptly. Rank 0 sends the launcher SIGTERM as soon as it runs;
// the launcher would otherwise go on to start all 300 (1500 took 148 s on two cores) before reading it.
TEST(Launcher, SigtermWhileStartingRanksStopsPromptlyLeavingNoRank) {
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);  // ranks orphaned by the launcher come here, to be checked and reaped
  const std::string dir = testing::temp_dir("starting");
  constexpr int kRanks = 300;
  const auto start = std::chrono::steady_clock::now();
  const pid_t launcher = ::fork();
  if (launcher == 0) {
    LaunchOptions o;
    o.nproc_per_node = kRanks;
    o.allow_oversubscribe = true;
    o.kill_grace_seconds = 2;
    o.command = {"sh", "-c", "echo $$ > " + dir + "/rank$LOCAL_RANK; "
                             "if [ \"$LOCAL_RANK\" = 0 ]; then kill -TERM $PPID; fi; exec sleep 30"};
    const int err = ::open((dir + "/err").c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
    const int devnull = ::open("/dev/null", O_WRONLY);
    o.stdout_fd = devnull;
    o.stderr_fd = err;
    ::_exit(launch(o));
  }
  int status = 0;
  ASSERT_EQ(::waitpid(launcher, &status, 0), launcher);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
  EXPECT_LT(seconds, 10.0);
  const std::string err = testing::read_text(dir + "/err");
  EXPECT_NE(err.find("received SIGTERM after starting"), std::string::npos) << err;
  EXPECT_NE(err.find("started no more"), std::string::npos) << err;

  std::vector<pid_t> ranks;
  for (int r = 0; r < kRanks; ++r) {
    std::ifstream in(dir + "/rank" + std::to_string(r));
    pid_t pid = 0;
    if (in >> pid) ranks.push_back(pid);
  }
  EXPECT_GE(ranks.size(), 1u);
  EXPECT_LT(ranks.size(), static_cast<size_t>(kRanks)) << "every rank started despite the SIGTERM";
  expect_gone_within_5_seconds(ranks, "the stopped launch");
}

TEST(Launcher, WarnsWhenThreadsTimesProcessesExceedTheCores) {
  const std::string warning = oversubscription_warning(8, "--threads 8", 2, 2);
  EXPECT_NE(warning.find("--threads 8 x 2 processes on this node = 16 threads on 2 cores"), std::string::npos) << warning;
  EXPECT_NE(warning.find("1 thread(s) each fit"), std::string::npos) << warning;
  EXPECT_EQ(oversubscription_warning(1, "OMP_NUM_THREADS=1", 2, 2), "");
  EXPECT_EQ(oversubscription_warning(8, "--threads 8", 1, 2), "") << "one process chooses its threads alone";
  EXPECT_NE(oversubscription_warning(1, "1 thread", 3, 2), "");
}

// kill -9 of the launcher leaves nobody to stop the ranks: the kernel must (PR_SET_PDEATHSIG).
TEST(Launcher, RanksDieWithAKilledLauncher) {
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);  // orphans come to this process, which reaps them
  const std::string dir = testing::temp_dir("orphans");
  const pid_t launcher = ::fork();
  if (launcher == 0) {
    LaunchOptions o;
    o.nproc_per_node = 2;
    o.command = {"sh", "-c", "echo $$ > " + dir + "/rank$LOCAL_RANK.tmp && mv " + dir + "/rank$LOCAL_RANK.tmp " + dir +
                                 "/rank$LOCAL_RANK && exec sleep 60"};
    const int devnull = ::open("/dev/null", O_WRONLY);
    o.stdout_fd = devnull;
    o.stderr_fd = devnull;
    ::_exit(launch(o));
  }
  std::vector<pid_t> ranks;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (ranks.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    ranks.clear();
    for (int r = 0; r < 2; ++r) {
      std::ifstream in(dir + "/rank" + std::to_string(r));
      pid_t pid = 0;
      if (in >> pid) ranks.push_back(pid);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(ranks.size(), 2u) << "the ranks did not start";
  for (const pid_t pid : ranks) ASSERT_TRUE(running(pid));
  ::kill(launcher, SIGKILL);
  ::waitpid(launcher, nullptr, 0);
  expect_gone_within_5_seconds(ranks, "its killed launcher");
}

}  // namespace
}  // namespace ptrain::distributed
