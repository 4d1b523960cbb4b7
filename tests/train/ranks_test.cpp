// What a process learns from its launcher: whether it may train alone, how many CPU threads it takes, and
// which settings every rank of a job must share (train/rank_agreement.h).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <map>
#include <optional>
#include <thread>

#include <CLI/CLI.hpp>

#include "ptrain/config/cli_options.h"
#include "ptrain/core/error.h"
#include "ptrain/train/plan.h"
#include "ptrain/train/rank_agreement.h"
#include "test_support.h"

namespace {

using ptrain::train::Settings;

// Sets environment variables for one test (nullptr: unset) and puts the old values back after.
class ScopedEnvironment {
 public:
  explicit ScopedEnvironment(const std::map<std::string, const char*>& variables) {
    for (const auto& [name, value] : variables) {
      const char* old = ::getenv(name.c_str());
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      if (value) {
        ::setenv(name.c_str(), value, 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }
  ~ScopedEnvironment() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// Every launcher's variables unset: the test sets the ones it means.
std::map<std::string, const char*> no_launcher() {
  std::map<std::string, const char*> none;
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                           "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "OMPI_COMM_WORLD_RANK",
                           "OMPI_COMM_WORLD_SIZE", "OMP_NUM_THREADS", "TORCHELASTIC_RUN_ID"})
    none[name] = nullptr;
  return none;
}

std::map<std::string, const char*> with(std::map<std::string, const char*> base,
                                        const std::map<std::string, const char*>& more) {
  for (const auto& [name, value] : more) base[name] = value;
  return base;
}

ptrain::config::TrainConfig cpu_config(const std::string& strategy = "single") {
  ptrain::config::TrainConfig c;
  c.run.device = "cpu";
  c.run.strategy = strategy;
  return c;
}

std::string plan_error(const ptrain::config::TrainConfig& c) {
  return ptrain::testing::error_message<ptrain::Error>([&] { ptrain::train::make_plan(c); });
}

TEST(LaunchedAlone, OneProcessStrategyRefusesAWorldOfSeveral) {
  const ScopedEnvironment torchrun(with(no_launcher(), {{"RANK", "1"}, {"WORLD_SIZE", "2"}}));
  for (const char* strategy : {"single", "dp"}) {
    auto c = cpu_config(strategy);
    c.dist.replicas = 2;
    const std::string message = plan_error(c);
    for (const char* part : {"RANK=1 and WORLD_SIZE=2", "one of 2 processes", "ddp, zero1, zero2, zero3 or fsdp"})
      EXPECT_NE(message.find(part), std::string::npos) << strategy << ": " << part << "\n" << message;
    EXPECT_NE(message.find(std::string("--strategy ") + strategy), std::string::npos) << message;
  }
  EXPECT_NO_THROW(ptrain::train::make_plan(cpu_config("ddp")));
}

TEST(LaunchedAlone, SlurmAndMpiVariablesCountToo) {
  {
    const ScopedEnvironment slurm(with(no_launcher(), {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}}));
    const std::string message = plan_error(cpu_config());
    EXPECT_NE(message.find("SLURM_PROCID=0 and SLURM_NTASKS=4 (Slurm)"), std::string::npos) << message;
  }
  {
    const ScopedEnvironment mpi(with(no_launcher(), {{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"}}));
    const std::string message = plan_error(cpu_config());
    EXPECT_NE(message.find("OMPI_COMM_WORLD_RANK=2 and OMPI_COMM_WORLD_SIZE=3"), std::string::npos) << message;
  }
  // A world of one is a single process, however it was started.
  const ScopedEnvironment one(with(no_launcher(), {{"RANK", "0"}, {"WORLD_SIZE", "1"}}));
  EXPECT_NO_THROW(ptrain::train::make_plan(cpu_config()));
}

TEST(CpuThreads, PlanTakesFlagThenOmpNumThreadsThenTheNodesShareOfCores) {
  const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  {
    const ScopedEnvironment plain(no_launcher());
    EXPECT_EQ(ptrain::train::make_plan(cpu_config()).device_setup.threads, cores);
    auto c = cpu_config();
    c.run.threads = 5;
    EXPECT_EQ(ptrain::train::make_plan(c).device_setup.threads, 5);
    EXPECT_NE(ptrain::train::describe(ptrain::train::make_plan(c)).find("device cpu (5 threads)"), std::string::npos);
  }
  {
    const ScopedEnvironment omp(with(no_launcher(), {{"OMP_NUM_THREADS", "3"}}));
    EXPECT_EQ(ptrain::train::make_plan(cpu_config()).device_setup.threads, 3);
  }
  {
    // Four ranks on this node share its cores.
    const ScopedEnvironment four(
        with(no_launcher(), {{"RANK", "1"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}}));
    EXPECT_EQ(ptrain::train::make_plan(cpu_config("ddp")).device_setup.threads, std::max<int64_t>(1, cores / 4));
  }
  const ScopedEnvironment bad(with(no_launcher(), {{"OMP_NUM_THREADS", "lots"}}));
  EXPECT_NE(plan_error(cpu_config()).find("OMP_NUM_THREADS='lots'"), std::string::npos) << plan_error(cpu_config());
}

std::string value_of(const Settings& settings, const std::string& key) {
  for (const auto& [name, value] : settings)
    if (name == key) return value;
  return "(absent)";
}

Settings with_value(Settings settings, const std::string& key, const std::string& value) {
  for (auto& [name, old] : settings)
    if (name == key) old = value;
  return settings;
}

TEST(RankAgreement, SettingsLeaveOutWhatMayDifferPerProcess) {
  const ScopedEnvironment plain(no_launcher());
  auto c = cpu_config();
  c.run.threads = 2;
  const Settings mine = ptrain::train::settings_to_agree(ptrain::train::make_plan(c));
  c.run.threads = 7;
  c.run.progress = "none";
  c.data.loader_threads = 5;
  EXPECT_EQ(ptrain::train::settings_to_agree(ptrain::train::make_plan(c)), mine);
  c.optim.lr = 0.5;
  EXPECT_NE(ptrain::train::settings_to_agree(ptrain::train::make_plan(c)), mine);
  EXPECT_EQ(value_of(mine, "optimizer.lr"), "0.1");
  EXPECT_EQ(value_of(mine, "run.device"), "(absent)");
  EXPECT_EQ(value_of(mine, "run.threads"), "(absent)");
  EXPECT_NE(value_of(mine, "precision policy").find("parameters fp32"), std::string::npos);
  EXPECT_EQ(value_of(mine, "strategy and sharding"), "single");
  c = cpu_config();
  c.precision.precision = "bf16";
  const Settings bf16 = ptrain::train::settings_to_agree(ptrain::train::make_plan(c));
  EXPECT_NE(value_of(bf16, "precision policy").find("parameters bf16"), std::string::npos) << value_of(bf16, "precision policy");
}

TEST(RankAgreement, FirstDisagreementNamesTheSettingItsValuesAndTheRanks) {
  const ScopedEnvironment plain(no_launcher());
  const Settings rank0 = ptrain::train::settings_to_agree(ptrain::train::make_plan(cpu_config()));
  EXPECT_EQ(ptrain::train::first_disagreement({rank0, rank0, rank0}), "");
  EXPECT_EQ(ptrain::train::first_disagreement({rank0}), "");

  const std::string lr = ptrain::train::first_disagreement({rank0, with_value(rank0, "optimizer.lr", "0.5")});
  for (const char* part : {"ranks disagree on optimizer.lr (--lr): 0.1 on rank 0; 0.5 on rank 1", "PTRAIN_LR"})
    EXPECT_NE(lr.find(part), std::string::npos) << part << "\n" << lr;

  // The first differing setting in rank 0's order, each value with every rank holding it.
  auto odd = with_value(rank0, "run.seed", "7");
  odd = with_value(odd, "run.strategy", "\"zero2\"");
  const std::string seed = ptrain::train::first_disagreement({rank0, odd, rank0, odd});
  EXPECT_NE(seed.find("ranks disagree on run.seed (--seed): 0 on ranks 0, 2; 7 on ranks 1, 3"), std::string::npos) << seed;

  // A resolved setting has no flag of its own.
  const std::string policy = ptrain::train::first_disagreement({rank0, with_value(rank0, "precision policy", "bf16")});
  EXPECT_NE(policy.find("ranks disagree on precision policy: "), std::string::npos) << policy;
  // A setting one rank lacks (another ptrain) is a difference too.
  Settings shorter(rank0.begin(), rank0.end() - 1);
  EXPECT_NE(ptrain::train::first_disagreement({rank0, shorter}).find("not set"), std::string::npos);
}

TEST(RankAgreement, EveryComparedKeyNamesAFlagOfPtrainTrain) {
  const ScopedEnvironment plain(no_launcher());
  ptrain::config::TrainConfig bound;
  CLI::App app;
  ptrain::config::add_train_options(app, bound);
  for (const auto& [key, value] : ptrain::train::settings_to_agree(ptrain::train::make_plan(cpu_config()))) {
    const std::string flag = ptrain::train::flag_of_setting(key);
    if (key.find(' ') != std::string::npos) {
      EXPECT_EQ(flag, "") << key;
      continue;
    }
    ASSERT_FALSE(flag.empty()) << key;
    EXPECT_NO_THROW(app.get_option(flag)) << key << " -> " << flag << " is no flag of ptrain train";
  }
}

}  // namespace
