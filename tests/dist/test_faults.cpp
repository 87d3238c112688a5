// Faults in a multi-process job: a rank that dies, a rank that never comes, a wrong WORLD_SIZE.
// Every surviving rank must exit non-zero with a clear message, within the configured timeout —
// never hang (each test's RankJob deadline is the hang guard: a rank still alive then fails it).
#include "parallel/launcher_store.h"
#include "rank_runner.h"
#include "test_util.h"

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <regex>
#include <filesystem>
#include <thread>

namespace fs = std::filesystem;
using namespace flowtrain::test;

namespace {

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

}  // namespace

TEST(DistFaults, KilledRankEndsEveryOtherRankWithinTheTimeout) {
  REQUIRE_DATA();
  const std::string base = scratch_dir("killed");
  RankJob job;
  job.world = 3;
  job.args = tiny_train_args(base + "/run", {"train.steps=100000", "data.batch_size=30", "train.log_every=1", "train.threads=1",
                                             "data.workers=1", "checkpoint.every=0", "parallel.timeout_s=20"});
  job.log_dir = base;
  job.deadline = std::chrono::seconds(90);  // timeout 20 s + start-up; a hang fails the test here
  const flowtrain::parallel::LauncherStore store(0);
  const auto pids = start_ranks(job, store);
  KillOnExit cleanup{pids};
  // Wait until training is under way (rank 0 logs step lines), then SIGKILL rank 1.
  ASSERT_TRUE(wait_for_step(base + "/rank-0.log", 5, std::chrono::seconds(60))) << read_if_exists(base + "/rank-0.log");
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(pids[1], SIGKILL), 0);
  auto results = wait_ranks(job, pids);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  std::printf("[faults] ranks 0 and 2 exited %d and %d, %.1f s after rank 1 was killed\n", results[0].exit_code,
              results[2].exit_code, seconds);
  EXPECT_EQ(results[1].exit_code, 128 + SIGKILL);
  for (int r : {0, 2}) {
    EXPECT_NE(results[r].exit_code, 0) << results[r].output;
    EXPECT_NE(results[r].exit_code, -1) << "rank " << r << " hung:\n" << results[r].output;
    EXPECT_TRUE(contains(results[r].output, "distributed failure")) << results[r].output;
  }
  EXPECT_LT(seconds, 20 + 15) << "the survivors must give up within parallel.timeout_s (+ shutdown)";
}

TEST(DistFaults, WrongWorldSizeIsRejectedAtStart) {
  REQUIRE_DATA();
  const std::string base = scratch_dir("wrong_world");
  RankJob job;
  job.world = 2;
  job.args = tiny_train_args(base + "/run", {"train.steps=5", "parallel.timeout_s=10"});
  job.log_dir = base;
  job.rank_env = {"", "WORLD_SIZE=3"};  // rank 1 was started with another WORLD_SIZE
  job.deadline = std::chrono::seconds(60);
  auto results = run_ranks(job);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(results[r].exit_code, 0) << results[r].output;
    EXPECT_NE(results[r].exit_code, -1) << "rank " << r << " hung";
  }
  EXPECT_TRUE(contains(results[0].output, "WORLD_SIZE")) << results[0].output;
  EXPECT_FALSE(fs::exists(base + "/run/checkpoints")) << "a rejected job must not create its run directory";
}

TEST(DistFaults, MissingRankTimesOutWithAClearError) {
  REQUIRE_DATA();
  const std::string base = scratch_dir("missing");
  RankJob job;
  job.world = 1;  // start only rank 0 of a world of 2
  job.args = tiny_train_args(base + "/run", {"train.steps=5", "parallel.timeout_s=5"});
  job.extra_env = {"WORLD_SIZE=2"};
  job.log_dir = base;
  job.deadline = std::chrono::seconds(60);
  auto results = run_ranks(job);
  EXPECT_NE(results[0].exit_code, 0) << results[0].output;
  EXPECT_NE(results[0].exit_code, -1) << "rank 0 hung";
  EXPECT_TRUE(contains(results[0].output, "rendezvous")) << results[0].output;
  EXPECT_TRUE(contains(results[0].output, "rank 1 of WORLD_SIZE 2 did not arrive")) << results[0].output;
}

TEST(DistFaults, HungRankEndsTheOthersAfterTheTimeout) {
  REQUIRE_DATA();
  const std::string base = scratch_dir("hung");
  RankJob job;
  job.world = 2;
  job.args = tiny_train_args(base + "/run", {"train.steps=100000", "train.log_every=1", "train.threads=1",
                                             "data.workers=1", "checkpoint.every=0", "parallel.timeout_s=8"});
  job.log_dir = base;
  job.deadline = std::chrono::seconds(60);
  const flowtrain::parallel::LauncherStore store(0);
  const auto pids = start_ranks(job, store);
  KillOnExit cleanup{pids};
  ASSERT_TRUE(wait_for_step(base + "/rank-0.log", 5, std::chrono::seconds(60))) << read_if_exists(base + "/rank-0.log");
  // A hung peer: alive, sockets open, but never joins the next collective.
  const auto stopped_at = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(pids[1], SIGSTOP), 0);
  int status = 0;
  while (waitpid(pids[0], &status, WNOHANG) == 0 && std::chrono::steady_clock::now() < stopped_at + job.deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count();
  kill(pids[1], SIGKILL);
  const std::string out = read_if_exists(base + "/rank-0.log");
  std::printf("[faults] rank 0 gave up %.1f s after rank 1 hung (parallel.timeout_s 8)\n", seconds);
  ASSERT_TRUE(WIFEXITED(status)) << "rank 0 did not exit within the deadline:\n" << out;
  EXPECT_NE(WEXITSTATUS(status), 0) << out;
  EXPECT_TRUE(contains(out, "distributed failure")) << out;
  EXPECT_GE(seconds, 7.0) << "gave up before the configured timeout:\n" << out;
  EXPECT_LT(seconds, 8 + 20) << out;
}

TEST(DistFaults, RankKilledInsideACheckpointWriteLeavesTheLastCompleteCheckpointToResumeFrom) {
  // World 2 saves every 5 steps. At step 10 each writer's model shard is cut to half its bytes
  // (what a kill during its write leaves) and the writer pauses; rank 1 is SIGKILLed there. Rank 0
  // must fail at the save's next barrier (not hang, not commit), and a restart must resume from
  // step 5 and finish exactly as an uninterrupted run.
  REQUIRE_DATA();
  const std::string base = scratch_dir("killed_mid_save");
  const std::vector<std::string> sets = {"train.steps=15",   "checkpoint.every=5", "train.log_every=1",
                                         "train.threads=1",  "data.workers=1",     "parallel.timeout_s=20",
                                         "train.tensorboard=false"};
  RankJob straight;
  straight.world = 2;
  straight.args = tiny_train_args(base + "/straight", sets);
  straight.log_dir = base + "/straight_logs";
  fs::create_directories(straight.log_dir);
  for (const auto& r : run_ranks(straight)) ASSERT_EQ(r.exit_code, 0) << r.output;

  const std::string run = base + "/run";
  RankJob job = straight;
  std::vector<std::string> paused = sets;
  paused.push_back("debug.allow_inject=true");
  paused.push_back("debug.inject.checkpoint_pause=10:5:torn");
  job.args = tiny_train_args(run, paused);
  job.log_dir = base;
  job.deadline = std::chrono::seconds(120);
  const flowtrain::parallel::LauncherStore store(0);
  const auto pids = start_ranks(job, store);
  KillOnExit cleanup{pids};
  const std::string shard1 = run + "/checkpoints/step-0000010.tmp/model.shard-00001-of-00002.safetensors";
  const std::string whole1 = base + "/straight/checkpoints/step-0000010/model.shard-00001-of-00002.safetensors";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  auto torn = [&] { return fs::exists(shard1) && fs::file_size(shard1) < fs::file_size(whole1); };
  while (!torn() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(torn()) << read_if_exists(base + "/rank-1.log");
  ASSERT_EQ(kill(pids[1], SIGKILL), 0);
  auto results = wait_ranks(job, pids);
  std::printf("[faults] rank 1 killed inside its step-10 shard write; rank 0 exited %d\n", results[0].exit_code);
  EXPECT_NE(results[0].exit_code, 0) << results[0].output;
  EXPECT_NE(results[0].exit_code, -1) << "rank 0 hung:\n" << results[0].output;
  EXPECT_FALSE(fs::exists(run + "/checkpoints/step-0000010")) << "a torn checkpoint was committed";
  EXPECT_TRUE(fs::exists(run + "/checkpoints/step-0000005/manifest.json"));

  RankJob again = straight;
  again.args = tiny_train_args(run, sets);
  again.log_dir = base + "/again_logs";
  fs::create_directories(again.log_dir);
  auto resumed = run_ranks(again);
  for (const auto& r : resumed) ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(resumed[0].output, "resumed from " + run + "/checkpoints/step-0000005")) << resumed[0].output;
  EXPECT_FALSE(fs::exists(run + "/checkpoints/step-0000010.tmp"));
  for (const auto& entry : fs::directory_iterator(base + "/straight/checkpoints/step-0000015")) {
    const std::string name = entry.path().filename().string();
    if (name == "manifest.json") continue;
    EXPECT_EQ(read_file(entry.path().string()), read_file(run + "/checkpoints/step-0000015/" + name)) << name;
  }
}
