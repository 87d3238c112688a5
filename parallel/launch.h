// The local launcher, what torchrun is to PyTorch: starts nproc_per_node copies of a command on
// this node with the torchrun variables set (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// NODE_RANK, GROUP_RANK, MASTER_ADDR, MASTER_PORT) plus FLOWTRAIN_LAUNCH=1, which tells
// resolve_dist_env to trust them over any Slurm variables the launcher itself inherited. As
// torchrun's agent does, node 0's launcher hosts the rendezvous store at MASTER_PORT
// (parallel/launcher_store.h) and tells the ranks so (TORCHELASTIC_USE_AGENT_STORE=True).
//
// Lifecycle: SIGINT, SIGTERM, SIGUSR1 and SIGUSR2 sent to the launcher are forwarded to every
// rank (Slurm's --signal=USR1@120 and Kubernetes' SIGTERM reach the trainers, which checkpoint
// and exit 0). The first rank to exit non-zero or die of a signal fails the node: the others get
// SIGTERM, then SIGKILL after grace_seconds, and the launcher returns that rank's code (128 +
// signal for a signal death). Once a failure is seen every wait is bounded, so a rank stuck in a
// collective with a dead peer cannot keep the job alive.
//
// One launch at a time per process: the signal handlers need a process-global wake-up pipe.
// The ranks are killed (SIGKILL) if the thread that called launch_local dies first.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/env.h"

namespace flowtrain::parallel {

// Bad launcher options (a usage error, caught before any rank starts).
struct LaunchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct LaunchOptions {
  int64_t nproc_per_node = 1, nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;               // 0: node 0 listens on a port the kernel picks (single node only)
  double grace_seconds = 30;         // after the first failure: SIGTERM the others, SIGKILL after this
  std::vector<std::string> command;  // argv of each rank (command[0] = executable path)
};

// Runs the ranks of this node to completion; returns the exit code to exit with. Throws
// LaunchError for invalid options or a command that cannot be executed.
int launch_local(const LaunchOptions& options);

// The node rank a multi-node `flowtrain launch` defaults to without --node-rank: the pod's
// JOB_COMPLETION_INDEX (Kubernetes Indexed Job), else SLURM_NODEID (one launcher per node under
// srun), else nullopt. Throws DistEnvError naming a variable that is not an integer.
std::optional<int64_t> default_node_rank(const EnvLookup& env);

// A TCP port that was free a moment ago (bound to port 0 and released), for a caller that cannot
// host its store first (a test standing in for pods whose rank 0 hosts it). Racy by nature.
int pick_free_port();

}  // namespace flowtrain::parallel
