// Starts N flowtrain processes as the ranks of one job on loopback (the torchrun variables, as
// `flowtrain launch` would set them) and collects their exit codes and output.
#pragma once

#include "parallel/mesh.h"

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace flowtrain::parallel {
class LauncherStore;
class Runtime;
}

namespace flowtrain::test {

struct RankResult {
  int exit_code = -1;   // 128 + signal for a signal death; −1 if killed by the deadline
  std::string output;   // stdout + stderr of the rank
};

struct RankJob {
  int world = 2;
  std::string args;                     // flowtrain arguments (shell text)
  std::vector<std::string> extra_env;   // VAR=value for every rank
  std::vector<std::string> rank_env;    // per rank: extra VAR=value text (may be empty)
  std::chrono::seconds deadline{300};   // hang guard: every rank still alive then is SIGKILLed
  std::string log_dir;                  // rank-R.log files go here
};

// Starts the ranks, returns their pids (for fault tests), does not wait. They rendezvous on
// `store` as on a launcher's (TORCHELASTIC_USE_AGENT_STORE=True), which must outlive them: it
// listens before they start, so no other test's socket can take the port in between.
std::vector<int> start_ranks(const RankJob& job, const parallel::LauncherStore& store);
// Waits for all (up to the job's deadline) and reads their logs.
std::vector<RankResult> wait_ranks(const RankJob& job, const std::vector<int>& pids);
std::vector<RankResult> run_ranks(const RankJob& job);  // on a store of its own

// The file's contents, or "" while it does not exist yet (a rank's log before it starts).
std::string read_if_exists(const std::string& path);

// Polls `log` until rank 0's step line for `step` appears (the number is right-aligned to the
// width of train.steps) or `timeout` passes; returns whether it appeared.
bool wait_for_step(const std::string& log, int step, std::chrono::seconds timeout);

// Kills (SIGKILL) and reaps every listed process still running when it goes out of scope, so a
// failed ASSERT in the middle of a multi-process test never leaves ranks running.
struct KillOnExit {
  std::vector<int> pids;
  ~KillOnExit();
};

// In-process ranks: runs body(rank, runtime) on `world` threads, each with its own Runtime (Gloo
// groups over a loopback TCPStore the harness hosts, as a launcher would; the given mesh, 60 s
// timeout). Returns each rank's error ("" when its body returned normally); the threads end with
// a world barrier.
std::vector<std::string> run_thread_ranks(int world, parallel::MeshShape mesh,
                                          const std::function<void(int rank, parallel::Runtime& runtime)>& body);
// The same against a store the caller hosts (parallel::LauncherStore) at `store_port`, as the
// ranks of launcher attempt `attempt`.
std::vector<std::string> run_thread_ranks(int world, parallel::MeshShape mesh, int store_port, int64_t attempt,
                                          const std::function<void(int rank, parallel::Runtime& runtime)>& body);

// The tiny test config's `train` arguments into out_dir, with --set flags (tiny_config(arch)).
std::string tiny_train_args(const std::string& out_dir, const std::vector<std::string>& sets,
                            const std::string& arch = "dit");

}  // namespace flowtrain::test
