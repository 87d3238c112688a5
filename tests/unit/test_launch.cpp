// The local launcher over `/bin/sh -c` ranks: the environment each rank gets, teardown after the
// first failure (SIGTERM, then SIGKILL after the grace period), exit codes of signal deaths,
// and forwarding of the launcher's signals to every rank.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "parallel/launch.h"
#include "test_util.h"

namespace flowtrain::parallel {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Hang guard, not a timing test: if launch_local ever stops returning, the test binary exits
// with a message after `limit` instead of blocking the suite; the ranks die with it (the
// launcher gives them PR_SET_PDEATHSIG). The limits are many times what a run takes.
class Watchdog {
 public:
  explicit Watchdog(std::chrono::seconds limit) {
    thread_ = std::thread([this, limit] {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!done_cv_.wait_for(lock, limit, [this] { return done_; })) {
        std::fprintf(stderr, "Watchdog: the launcher did not return within %lld s (hang)\n",
                     static_cast<long long>(limit.count()));
        std::_Exit(124);
      }
    });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_one();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

LaunchOptions sh_ranks(int64_t nproc, const std::string& script) {
  LaunchOptions o;
  o.nproc_per_node = nproc;
  o.command = {"/bin/sh", "-c", script};
  return o;
}

std::map<std::string, std::string> read_vars(const std::string& path) {
  std::map<std::string, std::string> vars;
  std::istringstream in(test::read_file(path));
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos && eq + 1 < line.size()) vars[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return vars;
}

// Each rank writes the launcher's variables to a file; this waits for `count` files named
// `prefix`* in `dir` (ranks that are up), bounded so a broken launcher fails instead of hanging.
bool wait_for_files(const std::string& dir, const std::string& prefix, size_t count) {
  const auto deadline = Clock::now() + std::chrono::seconds(15);
  while (Clock::now() < deadline) {
    size_t n = 0;
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.path().filename().string().rfind(prefix, 0) == 0) ++n;
    if (n >= count) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

bool process_gone(const std::string& pid_file) {
  const pid_t pid = std::stoi(test::read_file(pid_file));
  return ::kill(pid, 0) == -1 && errno == ESRCH;
}

// What every rank records: the variables the launcher promises.
const char* kWriteVars =
    "printf '%s\\n' RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE "
    "NODE_RANK=$NODE_RANK GROUP_RANK=$GROUP_RANK MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT "
    "FLOWTRAIN_LAUNCH=$FLOWTRAIN_LAUNCH TORCHELASTIC_USE_AGENT_STORE=$TORCHELASTIC_USE_AGENT_STORE "
    "TORCHELASTIC_RESTART_COUNT=$TORCHELASTIC_RESTART_COUNT > \"$D/vars.$RANK\"";

TEST(LaunchLocal, EveryRankGetsItsEnvironment) {
  const std::string dir = test::scratch_dir("launch");
  Watchdog guard(std::chrono::seconds(30));
  LaunchOptions o = sh_ranks(4, "D='" + dir + "'; " + kWriteVars);
  ASSERT_EQ(launch_local(o), 0);

  std::string port;
  for (int rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    auto vars = read_vars(dir + "/vars." + std::to_string(rank));
    EXPECT_EQ(vars["RANK"], std::to_string(rank));
    EXPECT_EQ(vars["WORLD_SIZE"], "4");
    EXPECT_EQ(vars["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(vars["LOCAL_WORLD_SIZE"], "4");
    EXPECT_EQ(vars["NODE_RANK"], "0");
    EXPECT_EQ(vars["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(vars["FLOWTRAIN_LAUNCH"], "1");
    if (rank == 0) port = vars["MASTER_PORT"];
    EXPECT_EQ(vars["MASTER_PORT"], port) << "every rank must meet at one port";
    // What the trainer will make of it.
    const DistEnv env = resolve_dist_env([&](const std::string& name) -> std::optional<std::string> {
      auto it = vars.find(name);
      return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
    });
    EXPECT_EQ(env.rank, rank);
    EXPECT_EQ(env.world, 4);
    EXPECT_EQ(env.local_rank, rank);
    EXPECT_EQ(env.local_world, 4);
    EXPECT_EQ(env.num_nodes, 1);
    EXPECT_EQ(env.source, "torchrun");
    EXPECT_TRUE(env.launcher_store);  // the launcher hosts the store: rank 0 must not try to
    EXPECT_EQ(env.store_attempt, 0);
  }
  const int p = std::stoi(port);  // the port the launcher's store listens on (master_port 0)
  EXPECT_GE(p, 1);
  EXPECT_LE(p, 65535);
}

// The port handed to the ranks is already listening when they start (no window in which another
// process could take it), and stays so while they run.
TEST(LaunchLocal, NodeZeroListensOnThePortItHandsTheRanks) {
  const std::string dir = test::scratch_dir("launch");
  Watchdog guard(std::chrono::seconds(30));
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.command = {"/bin/bash", "-c",
               "exec 3<>/dev/tcp/127.0.0.1/$MASTER_PORT && echo connected > '" + dir + "'/rank.$RANK"};
  ASSERT_EQ(launch_local(o), 0);
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_EQ(test::read_file(dir + "/rank." + std::to_string(rank)), "connected\n") << "rank " << rank;
}

TEST(LaunchLocal, APortInUseIsAnErrorBeforeAnyRankStarts) {
  const std::string dir = test::scratch_dir("launch");
  // Something else listens on the port first.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);

  LaunchOptions o = sh_ranks(2, "touch '" + dir + "/started.$RANK'");
  o.master_port = port;
  std::string message = "<no LaunchError thrown>";
  try {
    launch_local(o);
  } catch (const LaunchError& e) {
    message = e.what();
  }
  ::close(fd);
  EXPECT_NE(message.find("--master-port"), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(port)), std::string::npos) << message;
  EXPECT_TRUE(fs::is_empty(dir)) << "a rank started although the launcher could not host the store";
}

TEST(LaunchLocal, SecondNodeNumbersItsRanksAfterTheFirst) {
  const std::string dir = test::scratch_dir("launch");
  Watchdog guard(std::chrono::seconds(30));
  LaunchOptions o = sh_ranks(2, "D='" + dir + "'; " + kWriteVars);
  o.nnodes = 2;
  o.node_rank = 1;
  o.master_addr = "10.1.2.3";
  o.master_port = 29411;
  ASSERT_EQ(launch_local(o), 0);
  for (int local = 0; local < 2; ++local) {
    auto vars = read_vars(dir + "/vars." + std::to_string(2 + local));
    EXPECT_EQ(vars["RANK"], std::to_string(2 + local));
    EXPECT_EQ(vars["WORLD_SIZE"], "4");
    EXPECT_EQ(vars["LOCAL_RANK"], std::to_string(local));
    EXPECT_EQ(vars["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(vars["NODE_RANK"], "1");
    EXPECT_EQ(vars["GROUP_RANK"], "1");
    EXPECT_EQ(vars["MASTER_ADDR"], "10.1.2.3");
    EXPECT_EQ(vars["MASTER_PORT"], "29411");
  }
}

TEST(LaunchLocal, FirstFailureStopsTheOtherRanks) {
  const std::string dir = test::scratch_dir("launch");
  // Rank 0 dies of SIGTERM; rank 1 traps it and exits (recording that it did); rank 3 ignores
  // SIGTERM and needs the SIGKILL after the grace period; rank 2 fails with 3 once the others
  // are up.
  const std::string script = "D='" + dir + "'\n" + R"sh(case $RANK in
  0) echo $$ > "$D/pid.0"; touch "$D/ready.0"; exec sleep 60 ;;
  1) echo $$ > "$D/pid.1"; trap 'touch "$D/term.1"; exit 143' TERM; touch "$D/ready.1"
     while :; do sleep 0.05; done ;;
  2) i=0; while [ "$(ls "$D" | grep -c '^ready')" -lt 3 ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done
     exit 3 ;;
  3) echo $$ > "$D/pid.3"; trap '' TERM; touch "$D/ready.3"; exec sleep 60 ;;
esac)sh";
  LaunchOptions o = sh_ranks(4, script);
  o.grace_seconds = 2;
  const auto start = Clock::now();
  int code;
  {
    Watchdog guard(std::chrono::seconds(20));  // hang guard: a correct run takes ~2 s (the grace)
    code = launch_local(o);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(code, 3) << "the first failing rank's exit code";
  for (int rank : {0, 1, 3}) {
    const std::string pid_file = dir + "/pid." + std::to_string(rank);
    ASSERT_TRUE(fs::exists(pid_file)) << "rank " << rank << " never started";
    EXPECT_TRUE(process_gone(pid_file)) << "rank " << rank << " is still running";
  }
  EXPECT_TRUE(fs::exists(dir + "/term.1")) << "rank 1 did not receive SIGTERM";
  // Rank 3 ignores SIGTERM, so only the SIGKILL at the end of the grace period ends it.
  EXPECT_GE(seconds, 1.9);
  EXPECT_LT(seconds, 20);
}

TEST(LaunchLocal, SignalDeathBecomes128PlusSignal) {
  Watchdog guard(std::chrono::seconds(20));  // hang guard
  LaunchOptions o = sh_ranks(2, "if [ $RANK = 0 ]; then kill -KILL $$; else exec sleep 60; fi");
  o.grace_seconds = 2;
  EXPECT_EQ(launch_local(o), 128 + SIGKILL);
}

TEST(LaunchLocal, ReturnsAFailingExitCodeAfterOthersSucceed) {
  Watchdog guard(std::chrono::seconds(20));  // hang guard
  EXPECT_EQ(launch_local(sh_ranks(3, "[ $RANK = 2 ] && sleep 0.2 && exit 7; exit 0")), 7);
  EXPECT_EQ(launch_local(sh_ranks(3, "exit 0")), 0);
}

TEST(LaunchLocal, ForwardsSignalsToEveryRank) {
  const std::string dir = test::scratch_dir("launch");
  const std::string script = "D='" + dir + "'\n" + R"sh(trap 'echo got > "$D/got.$RANK"; exit 0' USR1
touch "$D/ready.$RANK"
while :; do sleep 0.05; done)sh";
  LaunchOptions o = sh_ranks(3, script);
  o.grace_seconds = 2;
  Watchdog guard(std::chrono::seconds(30));  // hang guard
  int code = -1;
  // The launcher runs on a thread, so this test can signal its own process, which is where
  // launch_local installed its handlers.
  std::thread launcher([&] { code = launch_local(o); });
  const bool up = wait_for_files(dir, "ready.", 3);
  EXPECT_TRUE(up) << "the ranks did not start";
  ::kill(::getpid(), up ? SIGUSR1 : SIGTERM);  // SIGTERM: still end the ranks if they half-started
  launcher.join();
  EXPECT_EQ(code, 0);
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_EQ(test::read_file(dir + "/got." + std::to_string(rank)), "got\n") << "rank " << rank;
}

TEST(LaunchLocal, RejectsBadOptionsBeforeStartingAnything) {
  auto message = [](const LaunchOptions& o) -> std::string {
    try {
      launch_local(o);
    } catch (const LaunchError& e) {
      return e.what();
    }
    return "<no LaunchError thrown>";
  };
  LaunchOptions o = sh_ranks(2, "exit 0");
  o.command = {};
  EXPECT_NE(message(o).find("no command"), std::string::npos);
  o = sh_ranks(2, "exit 0");
  o.command[0] = "/nonexistent/flowtrain";
  EXPECT_NE(message(o).find("/nonexistent/flowtrain"), std::string::npos);
  o = sh_ranks(2, "exit 0");
  o.nnodes = 2;
  o.node_rank = 0;
  EXPECT_NE(message(o).find("--master-port"), std::string::npos);  // nodes must agree on a port
  o.master_port = 29500;
  o.node_rank = 2;
  EXPECT_NE(message(o).find("--node-rank 2"), std::string::npos);
  o = sh_ranks(0, "exit 0");
  EXPECT_NE(message(o).find("--nproc-per-node 0"), std::string::npos);
}

TEST(LaunchLocal, DefaultNodeRankFromTheScheduler) {
  using Vars = std::map<std::string, std::string>;
  auto node_rank = [](const Vars& vars) {
    return default_node_rank([&](const std::string& name) -> std::optional<std::string> {
      auto it = vars.find(name);
      return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
    });
  };
  EXPECT_EQ(node_rank({}), std::nullopt);
  EXPECT_EQ(node_rank({{"JOB_COMPLETION_INDEX", "3"}}), 3);
  EXPECT_EQ(node_rank({{"SLURM_NODEID", "1"}}), 1);
  EXPECT_EQ(node_rank({{"JOB_COMPLETION_INDEX", "2"}, {"SLURM_NODEID", "0"}}), 2);
  try {
    node_rank({{"SLURM_NODEID", "one"}});
    ADD_FAILURE() << "no DistEnvError";
  } catch (const DistEnvError& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_NODEID=\"one\""), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace flowtrain::parallel
