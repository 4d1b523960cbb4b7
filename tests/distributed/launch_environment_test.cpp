#include <gtest/gtest.h>

#include <map>

#include "ptrain/core/error.h"
#include "ptrain/distributed/launch_environment.h"

namespace ptrain::distributed {
namespace {

struct FakeEnv {
  std::map<std::string, std::string> vars;
  std::function<const char*(const char*)> getenv() const {
    return [this](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

void expect_error(const FakeEnv& env, const std::string& fragment) {
  try {
    detect_environment(env.getenv());
    FAIL() << "expected an error naming " << fragment;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

// ptrain launch --max-restarts: the attempt and its causes, one line each; nothing set is a first attempt.
TEST(LaunchEnvironment, RestartCountAndCausesComeFromTheLauncher) {
  EXPECT_EQ(detect_restart(FakeEnv{}.getenv()).count, 0);
  EXPECT_TRUE(detect_restart(FakeEnv{{{"PTRAIN_RESTART_COUNT", "0"}, {"PTRAIN_RESTART_CAUSES", ""}}}.getenv()).causes.empty());
  const FakeEnv restarted{{{"PTRAIN_RESTART_COUNT", "2"},
                           {"PTRAIN_RESTART_CAUSES", "rank 1 exited with code 3\nrank 0 exited with signal 9 (SIGKILL)"}}};
  const RestartInfo info = detect_restart(restarted.getenv());
  EXPECT_EQ(info.count, 2);
  EXPECT_EQ(info.causes, (std::vector<std::string>{"rank 1 exited with code 3", "rank 0 exited with signal 9 (SIGKILL)"}));
  for (const char* bad : {"two", "-1"}) {
    try {
      detect_restart(FakeEnv{{{"PTRAIN_RESTART_COUNT", bad}}}.getenv());
      ADD_FAILURE() << "PTRAIN_RESTART_COUNT=" << bad << " must be refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("PTRAIN_RESTART_COUNT"), std::string::npos) << e.what();
    }
  }
}

TEST(LaunchEnvironment, NothingSetIsOneProcess) {
  const FakeEnv env;
  const auto e = detect_environment(env.getenv());
  EXPECT_EQ(e.source, "single");
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
}

TEST(LaunchEnvironment, Torchrun) {
  const FakeEnv env{{{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                     {"MASTER_ADDR", "10.0.0.2"}, {"MASTER_PORT", "1234"}}};
  const auto e = detect_environment(env.getenv());
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "10.0.0.2");
  EXPECT_EQ(e.master_port, 1234);
}

TEST(LaunchEnvironment, TorchrunWithoutLocalVariablesIsOneNode) {
  const FakeEnv env{{{"RANK", "2"}, {"WORLD_SIZE", "3"}}};
  const auto e = detect_environment(env.getenv());
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.local_world_size, 3);
}

TEST(LaunchEnvironment, SlurmCompressedNodeListAndTasksPerNode) {
  const FakeEnv env{{{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "2"}, {"SLURM_NODEID", "1"},
                     {"SLURM_TASKS_PER_NODE", "4(x2)"}, {"SLURM_JOB_NODELIST", "node[01-04,07]"}}};
  const auto e = detect_environment(env.getenv());
  EXPECT_EQ(e.source, "slurm");
  EXPECT_EQ(e.rank, 6);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "node01");
  EXPECT_EQ(e.master_port, 29500);
}

TEST(LaunchEnvironment, SlurmMasterAddrAndNtasksPerNodeWin) {
  const FakeEnv env{{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"},
                     {"SLURM_NTASKS_PER_NODE", "2"}, {"SLURM_TASKS_PER_NODE", "3,1"}, {"SLURM_NODELIST", "gpu7,gpu9"},
                     {"MASTER_ADDR", "head"}, {"MASTER_PORT", "40000"}}};
  const auto e = detect_environment(env.getenv());
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "head");
  EXPECT_EQ(e.master_port, 40000);
}

TEST(LaunchEnvironment, SlurmHelpers) {
  EXPECT_EQ(first_slurm_host("node[01-04,07]"), "node01");
  EXPECT_EQ(first_slurm_host("gpu7,gpu9"), "gpu7");
  EXPECT_EQ(first_slurm_host("rack[3,5]-n[10-11],other"), "rack3-n10");
  EXPECT_EQ(first_slurm_host("single"), "single");
  EXPECT_THROW(first_slurm_host("node[01-04"), Error);
  EXPECT_EQ(slurm_tasks_on_node("4(x2),3", 0), 4);
  EXPECT_EQ(slurm_tasks_on_node("4(x2),3", 1), 4);
  EXPECT_EQ(slurm_tasks_on_node("4(x2),3", 2), 3);
  EXPECT_THROW(slurm_tasks_on_node("4(x2),3", 3), Error);
  EXPECT_THROW(slurm_tasks_on_node("4(y2)", 0), Error);
}

TEST(LaunchEnvironment, OpenMpi) {
  const FakeEnv env{{{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"MASTER_ADDR", "mpi-head"}}};
  const auto e = detect_environment(env.getenv());
  EXPECT_EQ(e.source, "openmpi");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "mpi-head");
  EXPECT_EQ(e.master_port, 29500);
}

TEST(LaunchEnvironment, TorchrunBeatsSlurmBeatsOpenMpi) {
  FakeEnv env{{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"},
               {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}}};
  EXPECT_EQ(detect_environment(env.getenv()).source, "torchrun");
  env.vars.erase("RANK");
  env.vars.erase("WORLD_SIZE");
  EXPECT_EQ(detect_environment(env.getenv()).source, "slurm");
  env.vars.erase("SLURM_PROCID");
  EXPECT_EQ(detect_environment(env.getenv()).source, "openmpi");
}

TEST(LaunchEnvironment, InconsistentValuesNameTheVariable) {
  expect_error(FakeEnv{{{"RANK", "abc"}, {"WORLD_SIZE", "2"}}}, "RANK='abc'");
  expect_error(FakeEnv{{{"RANK", "2"}, {"WORLD_SIZE", "2"}}}, "RANK=2");
  expect_error(FakeEnv{{{"RANK", "0"}}}, "WORLD_SIZE is not set");
  expect_error(FakeEnv{{{"RANK", "0"}, {"WORLD_SIZE", "0"}}}, "WORLD_SIZE=0");
  expect_error(FakeEnv{{{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}},
               "LOCAL_RANK=2");
  expect_error(FakeEnv{{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}}, "MASTER_PORT=70000");
  expect_error(FakeEnv{{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29x"}}}, "MASTER_PORT='29x'");
  expect_error(FakeEnv{{{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}}, "SLURM_PROCID=4");
  expect_error(FakeEnv{{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "x"}}}, "SLURM_NTASKS='x'");
  expect_error(FakeEnv{{{"OMPI_COMM_WORLD_RANK", "-1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}}, "OMPI_COMM_WORLD_RANK=-1");
}

}  // namespace
}  // namespace ptrain::distributed
