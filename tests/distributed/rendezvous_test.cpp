// Where the ranks of one job meet and what they share: the launcher's port, run id and threads, a rank
// that reaches another job's store, text exchanged through the store, CPU threads per process.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <sstream>
#include <thread>

#include "multiprocess.h"
#include "ptrain/core/error.h"
#include "ptrain/distributed/cpu_threads.h"
#include "ptrain/distributed/launcher.h"
#include "ptrain/distributed/ports.h"
#include "ptrain/distributed/process_group.h"

namespace ptrain::distributed {
namespace {

using namespace std::chrono_literals;

struct LaunchOutput {
  int code;
  std::string out;
  std::string err;
};

LaunchOutput launch_and_capture(LaunchOptions options) {
  const std::string dir = testing::temp_dir("rendezvous");
  const int out_fd = ::open((dir + "/out").c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
  const int err_fd = ::open((dir + "/err").c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
  options.stdout_fd = out_fd;
  options.stderr_fd = err_fd;
  const int code = launch(options);
  ::close(out_fd);
  ::close(err_fd);
  return {code, testing::read_text(dir + "/out"), testing::read_text(dir + "/err")};
}

// "[rank N] <what rank N printed>" lines, by rank.
std::vector<std::string> per_rank_lines(const std::string& out, int ranks) {
  std::vector<std::string> lines(static_cast<size_t>(ranks));
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    for (int r = 0; r < ranks; ++r) {
      const std::string prefix = "[rank " + std::to_string(r) + "] ";
      if (line.rfind(prefix, 0) == 0) lines[static_cast<size_t>(r)] = line.substr(prefix.size());
    }
  }
  return lines;
}

// Sets a variable of the test process (nullptr: unsets it) until the end of the scope.
class ScopedVariable {
 public:
  ScopedVariable(const char* name, const char* value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = old;
    had_ = ::getenv(name) != nullptr;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedVariable() {
    if (had_) {
      ::setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

// A socket listening on a port of the kernel's choice, as another job's rendezvous store would.
class Listener {
 public:
  Listener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address);
    ::listen(fd_, 4);
    socklen_t length = sizeof address;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
  }
  ~Listener() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(Rendezvous, SingleNodeLaunchTakesAFreePortAndANewRunId) {
  const ScopedVariable no_inherited_id("TORCHELASTIC_RUN_ID", nullptr);
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.command = {"sh", "-c", "echo \"$MASTER_PORT $TORCHELASTIC_RUN_ID\""};
  const auto first = launch_and_capture(o);
  ASSERT_EQ(first.code, 0) << first.err;
  const auto lines = per_rank_lines(first.out, 2);
  EXPECT_EQ(lines[0], lines[1]) << "both ranks must meet at one port under one id\n" << first.out;
  std::istringstream fields(lines[0]);
  int port = 0;
  std::string run_id;
  fields >> port >> run_id;
  EXPECT_GT(port, 0) << first.out;
  EXPECT_LT(port, 65536) << first.out;
  EXPECT_FALSE(tcp_port_in_use(port)) << "the port picked must be one nobody holds";
  EXPECT_EQ(run_id.size(), 16u) << "a random id: " << first.out;
  // Another launch is another job: its own id.
  const auto second = launch_and_capture(o);
  ASSERT_EQ(second.code, 0) << second.err;
  EXPECT_NE(per_rank_lines(second.out, 2)[0].substr(lines[0].find(' ')), lines[0].substr(lines[0].find(' ')))
      << first.out << second.out;
}

TEST(Rendezvous, GivenRunIdAndInheritedOneReachTheRanks) {
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.command = {"sh", "-c", "echo \"id $TORCHELASTIC_RUN_ID\""};
  o.run_id = "job-7";
  auto r = launch_and_capture(o);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(per_rank_lines(r.out, 2), (std::vector<std::string>{"id job-7", "id job-7"})) << r.out;
  const ScopedVariable inherited("TORCHELASTIC_RUN_ID", "from-slurm-script");
  o.run_id.clear();
  r = launch_and_capture(o);
  EXPECT_EQ(per_rank_lines(r.out, 2), (std::vector<std::string>{"id from-slurm-script", "id from-slurm-script"}))
      << r.out;
}

TEST(Rendezvous, BusyMasterPortIsRefusedBeforeAnyRankStarts) {
  const Listener other_job;
  const std::string dir = testing::temp_dir("busy_port");
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.master_port = other_job.port();
  o.command = {"sh", "-c", "touch " + dir + "/started$RANK"};
  try {
    launch_and_capture(o);
    FAIL() << "a port another socket listens on must be refused";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("--master-port " + std::to_string(other_job.port()) + " is in use"), std::string::npos)
        << message;
    EXPECT_NE(message.find("leave --master-port out"), std::string::npos) << message;
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/started0"));
  EXPECT_TRUE(tcp_port_in_use(other_job.port()));
}

TEST(Rendezvous, LaunchSharesTheCoresAmongItsRanksUnlessOmpNumThreadsIsSet) {
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.command = {"sh", "-c", "echo \"threads $OMP_NUM_THREADS\""};
  {
    const ScopedVariable unset("OMP_NUM_THREADS", nullptr);
    const auto r = launch_and_capture(o);
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string expected = "threads " + std::to_string(threads_per_process(2, std::thread::hardware_concurrency()));
    EXPECT_EQ(per_rank_lines(r.out, 2), (std::vector<std::string>{expected, expected})) << r.out;
    EXPECT_NE(r.err.find("ptrain launch: OMP_NUM_THREADS="), std::string::npos) << r.err;
  }
  const ScopedVariable chosen("OMP_NUM_THREADS", "3");
  const auto r = launch_and_capture(o);
  EXPECT_EQ(per_rank_lines(r.out, 2), (std::vector<std::string>{"threads 3", "threads 3"})) << r.out;
  EXPECT_EQ(r.err.find("OMP_NUM_THREADS="), std::string::npos) << r.err;
}

TEST(Rendezvous, IntraOpThreadsFollowFlagThenOmpNumThreadsThenCoresPerProcess) {
  const auto environment = [](const char* omp) {
    return [omp](const char* name) -> const char* { return std::string(name) == "OMP_NUM_THREADS" ? omp : nullptr; };
  };
  EXPECT_EQ(threads_per_process(4, 16), 4);
  EXPECT_EQ(threads_per_process(3, 2), 1);
  EXPECT_EQ(threads_per_process(1, 0), 1);  // hardware_concurrency() may not know
  EXPECT_EQ(intra_op_threads(5, 2, 16, environment("3")), 5);
  EXPECT_EQ(intra_op_threads(0, 2, 16, environment("3")), 3);
  EXPECT_EQ(intra_op_threads(0, 2, 16, environment("4,2")), 4);
  EXPECT_EQ(intra_op_threads(0, 2, 16, environment(nullptr)), 8);
  EXPECT_EQ(intra_op_threads(0, 2, 16, environment("")), 8);
  for (const char* bad : {"0", "-1", "two", "3x"}) {
    try {
      intra_op_threads(0, 1, 16, environment(bad));
      ADD_FAILURE() << "OMP_NUM_THREADS=" << bad << " must be refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("OMP_NUM_THREADS='") + bad + "'"), std::string::npos) << e.what();
    }
  }
}

LaunchEnvironment of_job(int64_t rank, int64_t world, int port, const std::string& run_id) {
  auto env = testing::loopback(rank, world, port);
  env.run_id = run_id;
  return env;
}

bool wait_for_file(const std::string& path, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!std::filesystem::exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

TEST(Rendezvous, RankOfAnotherJobLeavesTheStoreAlone) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const int port = testing::free_port();
  const std::string dir = testing::temp_dir("intruder");
  // Processes 0 and 1 are job A's two ranks; process 2 is rank 1 of job B, sent to A's port.
  const auto outcomes = testing::run_ranks(
      {0, 1, 2},
      [&](int process) {
        if (process == 2) {
          if (!wait_for_file(dir + "/formed", 30)) throw std::runtime_error("job A never formed");
          try {
            ProcessGroup intruder(of_job(1, 2, port, "job-b"), "gloo", 5s);
          } catch (...) {
            std::ofstream(dir + "/intruder_done") << "";
            throw;
          }
          std::ofstream(dir + "/intruder_done") << "";
          throw std::runtime_error("rank 1 of job B joined job A's store");
        }
        ProcessGroup group(of_job(process, 2, port, "job-a"), "gloo", 30s);
        if (process == 0) std::ofstream(dir + "/formed") << "";
        if (!wait_for_file(dir + "/intruder_done", 30)) throw std::runtime_error("job B's rank never gave up");
        // Job A trains on, undisturbed.
        std::vector<torch::Tensor> one{torch::ones({3}) * (process + 1)};
        group.all_reduce_sum(one).wait();
        if (!torch::equal(one[0], torch::full({3}, 3.0f))) throw std::runtime_error("job A's sum is wrong");
      },
      90);
  EXPECT_EQ(outcomes[0].exit_code, 0) << outcomes[0].message;
  EXPECT_EQ(outcomes[1].exit_code, 0) << outcomes[1].message;
  EXPECT_EQ(outcomes[2].exit_code, 1) << outcomes[2].message;
  for (const std::string& part : std::vector<std::string>{"127.0.0.1:" + std::to_string(port), "belongs to another job",
                                                           "'job-a'", "'job-b'"})
    EXPECT_NE(outcomes[2].message.find(part), std::string::npos) << part << "\n" << outcomes[2].message;
}

TEST(Rendezvous, RanksExchangeTextThroughTheStore) {
  PTRAIN_SKIP_WITHOUT_GLOO();
  const int port = testing::free_port();
  const auto outcomes = testing::run_world(
      3,
      [&](int rank) {
        ProcessGroup group(testing::loopback(rank, 3, port), "gloo", 20s);
        for (const std::string name : {"first", "second"}) {
          const auto texts = group.all_gather_text(name, name + " of rank " + std::to_string(rank) +
                                                             std::string(static_cast<size_t>(rank) * 1000, 'x'));
          if (texts.size() != 3) throw std::runtime_error("expected 3 texts");
          for (int r = 0; r < 3; ++r) {
            if (texts[r] != name + " of rank " + std::to_string(r) + std::string(static_cast<size_t>(r) * 1000, 'x'))
              throw std::runtime_error(name + ": text " + std::to_string(r) + " is '" + texts[r].substr(0, 40) + "'");
          }
        }
      },
      60);
  for (size_t r = 0; r < outcomes.size(); ++r) EXPECT_EQ(outcomes[r].exit_code, 0) << r << ": " << outcomes[r].message;
}

}  // namespace
}  // namespace ptrain::distributed
