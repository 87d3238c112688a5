// `flowtrain launch` end to end: two ranks train under the local launcher, a SIGUSR1 to the
// launcher (what Slurm's --signal or a preemption sends) reaches both, they agree on the step,
// checkpoint it and exit 0; a second launch resumes from that checkpoint.
#include "cli_runner.h"
#include "rank_runner.h"
#include "test_util.h"

#include <signal.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <map>
#include <filesystem>
#include <regex>
#include <thread>

namespace fs = std::filesystem;
using namespace flowtrain::test;

TEST(DistLaunch, SignalToTheLauncherCheckpointsEveryRankAndTheRunResumes) {
  REQUIRE_DATA();
  const std::string base = scratch_dir("launch");
  const std::string run = base + "/run", log = base + "/launch.log";
  const std::string train = tiny_train_args(run, {"train.steps=100000", "train.log_every=1", "train.threads=1",
                                                  "data.workers=1", "checkpoint.every=0"});
  const std::string cmd = std::string(FLOWTRAIN_BINARY) + " launch --nproc-per-node 2 -- " + train;
  // The launcher runs in its own child so the test can signal and reap it.
  const pid_t launcher = fork();
  if (launcher == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + cmd + " > " + log + " 2>&1").c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  KillOnExit cleanup{{launcher}};  // the ranks die with their launcher (parent-death signal)
  ASSERT_TRUE(wait_for_step(log, 3, std::chrono::seconds(90))) << read_if_exists(log);
  ASSERT_EQ(kill(launcher, SIGUSR1), 0);

  // Hang guard: the launcher must be gone within a minute of the signal.
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (waitpid(launcher, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(launcher, SIGKILL);
      waitpid(launcher, &status, 0);
      FAIL() << "launcher still running a minute after SIGUSR1:\n" << read_file(log);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string out = read_file(log);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("checkpointing at step ([0-9]+)"))) << out;
  const int stopped_at = std::stoi(m[1].str());
  char name[32];
  std::snprintf(name, sizeof name, "step-%07d", stopped_at);
  EXPECT_TRUE(fs::exists(run + "/checkpoints/" + name + "/manifest.json")) << out;

  // Resume with the same launcher for two more steps.
  auto r = run_flowtrain("launch --nproc-per-node 2 -- " +
                         tiny_train_args(run, {"train.steps=" + std::to_string(stopped_at + 2), "train.log_every=1",
                                               "train.threads=1", "data.workers=1", "checkpoint.every=0"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + run + "/checkpoints/" + name), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(run + "/ranks/rank-00000.json"));
  EXPECT_TRUE(fs::exists(run + "/ranks/rank-00001.json"));
}

TEST(DistLaunch, ProfileTracesShowCommunicationPerRank) {
  REQUIRE_DATA();
  const std::string run = scratch_dir("profile") + "/run";
  auto r = run_flowtrain("launch --nproc-per-node 2 -- " +
                         tiny_train_args(run, {"train.steps=4", "train.threads=1", "data.workers=1",
                                               "profile.enabled=true", "profile.start_step=2", "profile.num_steps=2"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank : {0, 1}) {
    const std::string path = run + "/profiles/rank-" + std::to_string(rank) + "-step-2.json";
    ASSERT_TRUE(fs::exists(path)) << path << "\n" << r.output;
    const auto trace = nlohmann::json::parse(read_file(path));
    std::map<std::string, int> names;
    for (const auto& e : trace["traceEvents"])
      if (e.contains("name") && e["name"].is_string()) names[e["name"].get<std::string>()] += 1;
    // The step phases and FSDP's communication: gathers in forward and backward, one
    // reduce-scatter per unit (stem, 2 blocks, head) per step, waits where compute needed them.
    for (const char* phase : {"data_wait", "forward", "backward", "communication", "optimizer"})
      EXPECT_EQ(names[phase], 2) << "rank " << rank << ": " << phase;
    EXPECT_GE(names["fsdp.all_gather"], 2 * 4) << "rank " << rank;
    EXPECT_EQ(names["fsdp.reduce_scatter"], 2 * 4) << "rank " << rank;
    EXPECT_GE(names["fsdp.wait_reduce_scatter"], 2 * 4) << "rank " << rank;
    EXPECT_EQ(chrome_trace_problems(trace), "") << "rank " << rank;
  }
}
