// The launch environment: who am I (rank, local rank, node) and where is rank 0 (master), read
// from whatever started the process. One binary runs under `srun`, `flowtrain launch`, torchrun,
// a Kubeflow PyTorchJob, a Kubernetes Indexed Job, or by hand; each leaves different variables.
//
// Resolution order (first match wins):
//   (a) FLOWTRAIN_LAUNCH=1      started by `flowtrain launch` (maybe itself inside a Slurm step,
//                               where the SLURM_* variables describe the launcher, not the rank):
//                               the torchrun variables, all of them required.
//   (b) SLURM_PROCID set        srun: SLURM_PROCID/NTASKS/LOCALID/NODEID/NNODES, tasks per node,
//                               master = first host of the step's node list.
//   (c) RANK or WORLD_SIZE set  torchrun / Kubeflow PyTorchJob: RANK, WORLD_SIZE, LOCAL_RANK,
//                               LOCAL_WORLD_SIZE, GROUP_RANK|NODE_RANK, MASTER_ADDR, MASTER_PORT.
//   (d) JOB_COMPLETION_INDEX    Kubernetes Indexed Job: the index is the rank; WORLD_SIZE,
//                               MASTER_ADDR (`<job>-0.<headless-service>`) and MASTER_PORT required.
//   (e) none of these           a single process (world 1).
//
// A partial or inconsistent environment throws DistEnvError naming the variable and its value;
// a wrong guess here would hang every rank in the first collective instead.
// An empty variable counts as unset (`export RANK=` is how shells clear one).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace flowtrain::parallel {

struct DistEnvError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct DistEnv {
  int64_t rank = 0, world = 1, local_rank = 0, local_world = 1, node_rank = 0, num_nodes = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single";  // slurm | torchrun | k8s-indexed-job | single
  int64_t restart_count = 0;      // SLURM_RESTART_COUNT (requeued job), else 0
  // Who hosts the rendezvous store at master_addr:master_port. Normally rank 0. With
  // TORCHELASTIC_USE_AGENT_STORE=True (torchrun; `flowtrain launch` sets it too) the launcher
  // does, and every rank connects as a client, its keys under the launcher's attempt
  // (TORCHELASTIC_RESTART_COUNT) as PyTorch's own workers do: the ranks of a restarted attempt
  // meet the same long-lived store and must not see the keys of the attempt before.
  bool launcher_store = false;
  int64_t store_attempt = 0;
  // One log line: "rank 1/4 (local 1/2, node 0/2) via slurm, master host:port".
  std::string describe() const;
};

using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

DistEnv resolve_dist_env(const EnvLookup& env);  // pure: testable with a map
DistEnv resolve_dist_env_from_process();         // uses getenv

// Slurm's compressed hostlist syntax: comma-separated names, each with any number of bracket
// groups of comma-separated numbers and zero-padded ranges ("gpu[003-010,12]", "r[1-2]n[01-04]").
// Throws DistEnvError on a malformed list.
std::string first_slurm_host(const std::string& nodelist);                 // "gpu[003-010,12],cpu1" -> "gpu003"
int64_t count_slurm_hosts(const std::string& nodelist);                    // without expanding: 10 000 nodes is fine
std::vector<std::string> expand_slurm_hosts(const std::string& nodelist);  // what `scontrol show hostnames` prints

// Slurm's tasks-per-node syntax ("2(x3),1", "4,4,2"): the count on node `node`, or nullopt when
// the string does not parse or has no entry for that node.
std::optional<int64_t> slurm_tasks_on_node(const std::string& tasks_per_node, int64_t node);

// The port rank 0 listens on under Slurm when MASTER_PORT is unset: 10000 + job_id % 20000.
// Jobs sharing a node then rarely collide (a fixed 29500 always would), and 10000..29999 stays
// below Linux's ephemeral range (32768..60999), where outgoing connections take their ports.
// Two concurrent multi-rank steps of one job need MASTER_PORT set by hand.
int slurm_master_port(int64_t job_id);

}  // namespace flowtrain::parallel
