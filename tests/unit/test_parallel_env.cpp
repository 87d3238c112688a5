// The launch environment resolver: tables of environments (Slurm, torchrun, PyTorchJob,
// Kubernetes Indexed Job, flowtrain launch inside Slurm) → the DistEnv they mean, or the error
// that names the offending variable; and Slurm's hostlist / tasks-per-node syntax.
#include <gtest/gtest.h>

#include <map>

#include "parallel/env.h"

namespace flowtrain::parallel {
namespace {

using Vars = std::map<std::string, std::string>;

EnvLookup lookup(const Vars& vars) {
  return [&vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string error_of(const Vars& vars) {
  try {
    DistEnv e = resolve_dist_env(lookup(vars));
    return "<no DistEnvError; resolved " + e.describe() + ">";
  } catch (const DistEnvError& e) {
    return e.what();
  }
}

DistEnv make(int64_t rank, int64_t world, int64_t local_rank, int64_t local_world, int64_t node_rank, int64_t num_nodes,
             std::string master_addr, int master_port, std::string source, int64_t restart_count = 0) {
  DistEnv e;
  e.rank = rank;
  e.world = world;
  e.local_rank = local_rank;
  e.local_world = local_world;
  e.node_rank = node_rank;
  e.num_nodes = num_nodes;
  e.master_addr = std::move(master_addr);
  e.master_port = master_port;
  e.source = std::move(source);
  e.restart_count = restart_count;
  return e;
}

struct ResolveCase {
  std::string name;
  Vars vars;
  DistEnv expected;
};

// Slurm's derived port for SLURM_JOB_ID=123456 (see slurm_master_port): 10000 + 3456.
constexpr int kJobPort = 13456;

const std::vector<ResolveCase>& resolve_cases() {
  static const std::vector<ResolveCase> cases = {
      {"nothing set: one process", {}, make(0, 1, 0, 1, 0, 1, "127.0.0.1", 29500, "single")},
      {"empty values count as unset",
       {{"RANK", ""}, {"WORLD_SIZE", ""}},
       make(0, 1, 0, 1, 0, 1, "127.0.0.1", 29500, "single")},
      {"srun 2 nodes x 2 tasks",
       {{"SLURM_PROCID", "3"},
        {"SLURM_NTASKS", "4"},
        {"SLURM_LOCALID", "1"},
        {"SLURM_NODEID", "1"},
        {"SLURM_NNODES", "2"},
        {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
        {"SLURM_JOB_NODELIST", "gpu[003-004]"},
        {"SLURM_JOB_ID", "123456"}},
       make(3, 4, 1, 2, 1, 2, "gpu003", kJobPort, "slurm")},
      {"srun uneven layout 2,1 (node 1 has one task)",
       {{"SLURM_PROCID", "2"},
        {"SLURM_NTASKS", "3"},
        {"SLURM_LOCALID", "0"},
        {"SLURM_NODEID", "1"},
        {"SLURM_NNODES", "2"},
        {"SLURM_TASKS_PER_NODE", "2,1"},
        {"SLURM_JOB_NODELIST", "a,b"}},
       make(2, 3, 0, 1, 1, 2, "a", 29500, "slurm")},
      {"srun 4(x2),3 on the third node",
       {{"SLURM_PROCID", "9"},
        {"SLURM_NTASKS", "11"},
        {"SLURM_LOCALID", "1"},
        {"SLURM_NODEID", "2"},
        {"SLURM_NNODES", "3"},
        {"SLURM_STEP_TASKS_PER_NODE", "4(x2),3"},
        {"SLURM_JOB_NODELIST", "n[1-3]"}},
       make(9, 11, 1, 3, 2, 3, "n1", 29500, "slurm")},
      {"step layout beats the job's --ntasks-per-node",
       {{"SLURM_PROCID", "1"},
        {"SLURM_NTASKS", "2"},
        {"SLURM_LOCALID", "1"},
        {"SLURM_NODEID", "0"},
        {"SLURM_NNODES", "1"},
        {"SLURM_STEP_TASKS_PER_NODE", "2"},
        {"SLURM_NTASKS_PER_NODE", "8"},
        {"SLURM_JOB_NODELIST", "gpu1"}},
       make(1, 2, 1, 2, 0, 1, "gpu1", 29500, "slurm")},
      {"srun --ntasks-per-node=8",
       {{"SLURM_PROCID", "12"},
        {"SLURM_NTASKS", "16"},
        {"SLURM_LOCALID", "4"},
        {"SLURM_NODEID", "1"},
        {"SLURM_NNODES", "2"},
        {"SLURM_NTASKS_PER_NODE", "8"},
        {"SLURM_JOB_NODELIST", "h[07-08]"}},
       make(12, 16, 4, 8, 1, 2, "h07", 29500, "slurm")},
      {"srun without a tasks-per-node variable: ntasks / nnodes",
       {{"SLURM_PROCID", "5"},
        {"SLURM_NTASKS", "8"},
        {"SLURM_LOCALID", "1"},
        {"SLURM_NODEID", "1"},
        {"SLURM_NNODES", "2"},
        {"SLURM_NODELIST", "x[1,5]"}},
       make(5, 8, 1, 4, 1, 2, "x1", 29500, "slurm")},
      {"Slurm: MASTER_ADDR / MASTER_PORT override, requeued twice",
       {{"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "2"},
        {"SLURM_LOCALID", "0"},
        {"SLURM_NODEID", "0"},
        {"SLURM_NNODES", "2"},
        {"SLURM_JOB_NODELIST", "gpu[1-2]"},
        {"SLURM_JOB_ID", "77"},
        {"MASTER_ADDR", "10.0.0.9"},
        {"MASTER_PORT", "31000"},
        {"SLURM_RESTART_COUNT", "2"}},
       make(0, 2, 0, 1, 0, 2, "10.0.0.9", 31000, "slurm", 2)},
      {"Slurm: the step's node list beats the job's (rank 0 runs on the step's first node)",
       {{"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "1"},
        {"SLURM_NNODES", "1"},
        {"SLURM_STEP_NODELIST", "gpu[12-13]"},
        {"SLURM_JOB_NODELIST", "gpu[10-13]"}},
       make(0, 1, 0, 1, 0, 1, "gpu12", 29500, "slurm")},
      {"Slurm batch shell: one task, nothing else",
       {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}},
       make(0, 1, 0, 1, 0, 1, "127.0.0.1", 29500, "slurm")},
      {"torchrun 2 nodes x 4",
       {{"RANK", "5"},
        {"WORLD_SIZE", "8"},
        {"LOCAL_RANK", "1"},
        {"LOCAL_WORLD_SIZE", "4"},
        {"GROUP_RANK", "1"},
        {"MASTER_ADDR", "node0"},
        {"MASTER_PORT", "29400"}},
       make(5, 8, 1, 4, 1, 2, "node0", 29400, "torchrun")},
      {"torchrun: NODE_RANK and GROUP_WORLD_SIZE",
       {{"RANK", "3"},
        {"WORLD_SIZE", "4"},
        {"LOCAL_RANK", "1"},
        {"GROUP_WORLD_SIZE", "2"},
        {"NODE_RANK", "1"},
        {"MASTER_ADDR", "node0"}},
       make(3, 4, 1, 2, 1, 2, "node0", 29500, "torchrun")},
      {"hand-set RANK/WORLD_SIZE on one host: LOCAL_RANK defaults to RANK",
       {{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29501"}},
       make(2, 4, 2, 4, 0, 1, "127.0.0.1", 29501, "torchrun")},
      {"world of one needs no master",
       {{"RANK", "0"}, {"WORLD_SIZE", "1"}},
       make(0, 1, 0, 1, 0, 1, "127.0.0.1", 29500, "torchrun")},
      {"Kubeflow PyTorchJob: one rank per pod",
       {{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "train-master-0"}, {"MASTER_PORT", "23456"}},
       make(3, 4, 0, 1, 3, 4, "train-master-0", 23456, "torchrun")},
      {"Kubernetes Indexed Job",
       {{"JOB_COMPLETION_INDEX", "2"},
        {"WORLD_SIZE", "4"},
        {"MASTER_ADDR", "train-0.train-svc"},
        {"MASTER_PORT", "29500"}},
       make(2, 4, 0, 1, 2, 4, "train-0.train-svc", 29500, "k8s-indexed-job")},
      {"Indexed Job pod running flowtrain launch: RANK wins over JOB_COMPLETION_INDEX",
       {{"JOB_COMPLETION_INDEX", "1"},
        {"FLOWTRAIN_LAUNCH", "1"},
        {"RANK", "3"},
        {"WORLD_SIZE", "4"},
        {"LOCAL_RANK", "1"},
        {"LOCAL_WORLD_SIZE", "2"},
        {"GROUP_RANK", "1"},
        {"MASTER_ADDR", "train-0.svc"},
        {"MASTER_PORT", "29500"}},
       make(3, 4, 1, 2, 1, 2, "train-0.svc", 29500, "torchrun")},
      {"flowtrain launch inside a Slurm step: the launcher's variables win, the requeue count stays",
       {{"FLOWTRAIN_LAUNCH", "1"},
        {"RANK", "5"},
        {"WORLD_SIZE", "8"},
        {"LOCAL_RANK", "1"},
        {"LOCAL_WORLD_SIZE", "4"},
        {"NODE_RANK", "1"},
        {"GROUP_RANK", "1"},
        {"MASTER_ADDR", "gpu003"},
        {"MASTER_PORT", "29500"},
        {"SLURM_PROCID", "1"},
        {"SLURM_NTASKS", "2"},
        {"SLURM_LOCALID", "0"},
        {"SLURM_NODEID", "1"},
        {"SLURM_NNODES", "2"},
        {"SLURM_JOB_NODELIST", "gpu[003-004]"},
        {"SLURM_JOB_ID", "123456"},
        {"SLURM_RESTART_COUNT", "1"}},
       make(5, 8, 1, 4, 1, 2, "gpu003", 29500, "torchrun", 1)},
      {"torchrun inside a Slurm step (TORCHELASTIC_RUN_ID)",
       {{"TORCHELASTIC_RUN_ID", "job-7"},
        {"RANK", "6"},
        {"WORLD_SIZE", "8"},
        {"LOCAL_RANK", "2"},
        {"LOCAL_WORLD_SIZE", "4"},
        {"GROUP_RANK", "1"},
        {"MASTER_ADDR", "gpu1"},
        {"MASTER_PORT", "29500"},
        {"SLURM_PROCID", "1"},
        {"SLURM_NTASKS", "2"},
        {"SLURM_LOCALID", "0"},
        {"SLURM_NODEID", "1"},
        {"SLURM_NNODES", "2"},
        {"SLURM_JOB_NODELIST", "gpu[1-2]"}},
       make(6, 8, 2, 4, 1, 2, "gpu1", 29500, "torchrun")},
      {"FLOWTRAIN_LAUNCH other than 1 is ignored",
       {{"FLOWTRAIN_LAUNCH", "0"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}},
       make(0, 1, 0, 1, 0, 1, "127.0.0.1", 29500, "slurm")},
  };
  return cases;
}

TEST(ParallelEnv, ResolvesEveryLauncherLayout) {
  for (const ResolveCase& c : resolve_cases()) {
    SCOPED_TRACE(c.name);
    DistEnv got;
    try {
      got = resolve_dist_env(lookup(c.vars));
    } catch (const DistEnvError& e) {
      ADD_FAILURE() << "unexpected DistEnvError: " << e.what();
      continue;
    }
    EXPECT_EQ(got.describe(), c.expected.describe());  // one readable line on mismatch
    EXPECT_EQ(got.rank, c.expected.rank);
    EXPECT_EQ(got.world, c.expected.world);
    EXPECT_EQ(got.local_rank, c.expected.local_rank);
    EXPECT_EQ(got.local_world, c.expected.local_world);
    EXPECT_EQ(got.node_rank, c.expected.node_rank);
    EXPECT_EQ(got.num_nodes, c.expected.num_nodes);
    EXPECT_EQ(got.master_addr, c.expected.master_addr);
    EXPECT_EQ(got.master_port, c.expected.master_port);
    EXPECT_EQ(got.source, c.expected.source);
    EXPECT_EQ(got.restart_count, c.expected.restart_count);
  }
}

struct ErrorCase {
  std::string name;
  Vars vars;
  std::vector<std::string> expected;  // substrings of the message: the variable and its value
};

TEST(ParallelEnv, RejectsPartialOrInconsistentEnvironments) {
  const Vars slurm2 = {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"},
                       {"SLURM_NODEID", "0"}, {"SLURM_NNODES", "2"}, {"SLURM_JOB_NODELIST", "gpu[1-2]"}};
  auto with = [](Vars base, const Vars& more) {
    for (const auto& [k, v] : more) base[k] = v;
    return base;
  };
  auto without = [](Vars base, const std::string& name) {
    base.erase(name);
    return base;
  };
  const std::vector<ErrorCase> cases = {
      {"RANK without WORLD_SIZE", {{"RANK", "1"}}, {"RANK=1", "WORLD_SIZE"}},
      {"WORLD_SIZE without RANK", {{"WORLD_SIZE", "4"}}, {"WORLD_SIZE=4", "RANK"}},
      {"non-integer RANK", {{"RANK", "abc"}, {"WORLD_SIZE", "2"}}, {"RANK=\"abc\"", "not an integer"}},
      {"trailing junk", {{"RANK", "1x"}, {"WORLD_SIZE", "2"}}, {"RANK=\"1x\""}},
      {"negative RANK", {{"RANK", "-1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}, {"RANK=-1"}},
      {"zero WORLD_SIZE", {{"RANK", "0"}, {"WORLD_SIZE", "0"}}, {"WORLD_SIZE=0"}},
      {"RANK >= WORLD_SIZE",
       {{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "127.0.0.1"}},
       {"RANK=4", "WORLD_SIZE=4"}},
      {"LOCAL_RANK >= LOCAL_WORLD_SIZE",
       {{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "4"}, {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "m"}},
       {"LOCAL_RANK=4", "LOCAL_WORLD_SIZE=4"}},
      {"LOCAL_WORLD_SIZE > WORLD_SIZE",
       {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "m"}},
       {"LOCAL_WORLD_SIZE=4", "WORLD_SIZE=2"}},
      {"GROUP_RANK out of range",
       {{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "2"}, {"MASTER_ADDR", "m"}},
       {"GROUP_RANK=2"}},
      {"WORLD_SIZE not a multiple of GROUP_WORLD_SIZE",
       {{"RANK", "0"}, {"WORLD_SIZE", "5"}, {"GROUP_WORLD_SIZE", "2"}, {"MASTER_ADDR", "m"}},
       {"WORLD_SIZE=5", "GROUP_WORLD_SIZE=2"}},
      {"LOCAL_RANK on a remote master without LOCAL_WORLD_SIZE",
       {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "node0"}},
       {"LOCAL_WORLD_SIZE", "MASTER_ADDR=node0"}},
      {"world > 1 without MASTER_ADDR", {{"RANK", "1"}, {"WORLD_SIZE", "2"}}, {"MASTER_ADDR", "WORLD_SIZE=2"}},
      {"port above 65535", {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}}, {"MASTER_PORT=70000"}},
      {"port 0", {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "0"}}, {"MASTER_PORT=0"}},
      {"non-integer port", {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "http"}}, {"MASTER_PORT=\"http\""}},
      {"FLOWTRAIN_LAUNCH=1 without RANK",
       {{"FLOWTRAIN_LAUNCH", "1"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}},
       {"FLOWTRAIN_LAUNCH=1", "RANK"}},
      {"SLURM_PROCID without SLURM_NTASKS", {{"SLURM_PROCID", "0"}}, {"SLURM_PROCID=0", "SLURM_NTASKS"}},
      {"non-integer SLURM_NTASKS", {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "x"}}, {"SLURM_NTASKS=\"x\""}},
      {"SLURM_PROCID >= SLURM_NTASKS", with(slurm2, {{"SLURM_PROCID", "4"}}), {"SLURM_PROCID=4", "SLURM_NTASKS=4"}},
      {"SLURM_LOCALID beyond the step layout",
       with(slurm2, {{"SLURM_LOCALID", "2"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}}),
       {"SLURM_LOCALID=2", "SLURM_STEP_TASKS_PER_NODE"}},
      {"SLURM_NODEID >= SLURM_NNODES", with(slurm2, {{"SLURM_NODEID", "2"}}), {"SLURM_NODEID=2", "SLURM_NNODES=2"}},
      {"two nodes without SLURM_NODEID", without(slurm2, "SLURM_NODEID"), {"SLURM_NODEID", "SLURM_NNODES=2"}},
      {"two nodes without SLURM_LOCALID", without(slurm2, "SLURM_LOCALID"), {"SLURM_LOCALID"}},
      {"two nodes without a node list or MASTER_ADDR",
       without(slurm2, "SLURM_JOB_NODELIST"),
       {"SLURM_JOB_NODELIST", "SLURM_NNODES=2"}},
      {"malformed node list", with(slurm2, {{"SLURM_JOB_NODELIST", "gpu[1-"}}), {"SLURM_JOB_NODELIST", "gpu[1-"}},
      {"non-integer SLURM_NTASKS_PER_NODE",
       with(slurm2, {{"SLURM_NTASKS_PER_NODE", "2x"}}),
       {"SLURM_NTASKS_PER_NODE=\"2x\""}},
      {"Slurm: bad MASTER_PORT", with(slurm2, {{"MASTER_PORT", "65536"}}), {"MASTER_PORT=65536"}},
      {"non-integer SLURM_RESTART_COUNT",
       with(slurm2, {{"SLURM_RESTART_COUNT", "one"}}),
       {"SLURM_RESTART_COUNT=\"one\""}},
      {"TORCHELASTIC_USE_AGENT_STORE neither True nor False",
       {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"TORCHELASTIC_USE_AGENT_STORE", "yes"}},
       {"TORCHELASTIC_USE_AGENT_STORE=\"yes\""}},
      {"negative TORCHELASTIC_RESTART_COUNT",
       {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"TORCHELASTIC_RESTART_COUNT", "-1"}},
       {"TORCHELASTIC_RESTART_COUNT=-1"}},
      {"Indexed Job without WORLD_SIZE", {{"JOB_COMPLETION_INDEX", "0"}}, {"JOB_COMPLETION_INDEX=0", "WORLD_SIZE"}},
      {"Indexed Job without MASTER_ADDR",
       {{"JOB_COMPLETION_INDEX", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}},
       {"MASTER_ADDR", "<job>-0.<headless-service>"}},
      {"Indexed Job without MASTER_PORT",
       {{"JOB_COMPLETION_INDEX", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "j-0.svc"}},
       {"MASTER_PORT", "JOB_COMPLETION_INDEX=1"}},
      {"Indexed Job index beyond WORLD_SIZE",
       {{"JOB_COMPLETION_INDEX", "5"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "j-0.svc"}, {"MASTER_PORT", "29500"}},
       {"JOB_COMPLETION_INDEX=5", "WORLD_SIZE=4"}},
  };
  for (const ErrorCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string message = error_of(c.vars);
    for (const std::string& part : c.expected)
      EXPECT_NE(message.find(part), std::string::npos) << "expected \"" << part << "\" in: " << message;
  }
}

TEST(ParallelEnv, DescribeIsOneLogLine) {
  DistEnv e = make(1, 4, 1, 2, 0, 2, "gpu003", 13456, "slurm");
  EXPECT_EQ(e.describe(), "rank 1/4 (local 1/2, node 0/2) via slurm, master gpu003:13456");
  e.restart_count = 3;
  EXPECT_EQ(e.describe(), "rank 1/4 (local 1/2, node 0/2) via slurm, master gpu003:13456, restart 3");
}

// torchrun's agent hosts the store at MASTER_PORT and restarts the workers against it
// (--max-restarts): they must connect as clients and keep each attempt's keys apart.
TEST(ParallelEnv, TorchrunsAgentStoreMakesEveryRankAClientOfItsAttempt) {
  Vars vars = {{"TORCHELASTIC_RUN_ID", "none"}, {"RANK", "1"},        {"WORLD_SIZE", "2"},
               {"LOCAL_RANK", "1"},             {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", "29500"},        {"TORCHELASTIC_USE_AGENT_STORE", "True"},
               {"TORCHELASTIC_RESTART_COUNT", "2"}};
  DistEnv e = resolve_dist_env(lookup(vars));
  EXPECT_TRUE(e.launcher_store);
  EXPECT_EQ(e.store_attempt, 2);
  EXPECT_EQ(e.describe(),
            "rank 1/2 (local 1/2, node 0/1) via torchrun, master 127.0.0.1:29500, store hosted by the launcher (attempt 2)");
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_FALSE(resolve_dist_env(lookup(vars)).launcher_store);
  vars.erase("TORCHELASTIC_USE_AGENT_STORE");
  EXPECT_FALSE(resolve_dist_env(lookup(vars)).launcher_store);  // rank 0 hosts, as without torchrun
}

TEST(ParallelEnv, SlurmPortComesFromTheJobId) {
  EXPECT_EQ(slurm_master_port(0), 10000);
  EXPECT_EQ(slurm_master_port(123456), 13456);
  EXPECT_EQ(slurm_master_port(19999), 29999);
  EXPECT_EQ(slurm_master_port(20000), 10000);
}

TEST(ParallelEnv, HostlistSyntax) {
  struct Case {
    std::string list;
    std::vector<std::string> hosts;  // what `scontrol show hostnames` prints
  };
  const std::vector<Case> cases = {
      {"node1", {"node1"}},
      {"a,b,c", {"a", "b", "c"}},
      {"gpu[003-010,12],cpu1",
       {"gpu003", "gpu004", "gpu005", "gpu006", "gpu007", "gpu008", "gpu009", "gpu010", "gpu12", "cpu1"}},
      {"n[8-11]", {"n8", "n9", "n10", "n11"}},                     // no padding: widths grow
      {"gpu[098-101]", {"gpu098", "gpu099", "gpu100", "gpu101"}},  // padding to the low end's width
      {"r[1-2]n[01-02]", {"r1n01", "r1n02", "r2n01", "r2n02"}},    // several groups: the last varies fastest
      {"x[1-2]-ib,y[7]", {"x1-ib", "x2-ib", "y7"}},
      {"[1-2]", {"1", "2"}},
      {"host-1.cluster.local", {"host-1.cluster.local"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.list);
    EXPECT_EQ(expand_slurm_hosts(c.list), c.hosts);
    EXPECT_EQ(count_slurm_hosts(c.list), static_cast<int64_t>(c.hosts.size()));
    EXPECT_EQ(first_slurm_host(c.list), c.hosts.front());
  }
  // Counting never expands: a cluster-sized list is cheap.
  EXPECT_EQ(count_slurm_hosts("big[0000-9999],huge[00000-99999]"), 110000);
  EXPECT_EQ(first_slurm_host("big[0000-9999],huge[00000-99999]"), "big0000");
  EXPECT_EQ(count_slurm_hosts(""), 0);

  for (const std::string bad :
       {"gpu[1-", "gpu]", "a,,b", "a,", ",a", "gpu[3-1]", "gpu[a]", "gpu[]", "gpu[1-2-3]", "gpu[1,]", "a b", ""}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(first_slurm_host(bad), DistEnvError);
    if (!bad.empty()) {
      EXPECT_THROW(count_slurm_hosts(bad), DistEnvError);
    }
  }
}

TEST(ParallelEnv, SlurmTasksPerNodeSyntax) {
  EXPECT_EQ(slurm_tasks_on_node("8", 0), 8);
  EXPECT_EQ(slurm_tasks_on_node("8", 1), std::nullopt);  // one entry covers one node
  EXPECT_EQ(slurm_tasks_on_node("2(x3)", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 4), std::nullopt);
  EXPECT_EQ(slurm_tasks_on_node("2,1", 1), 1);
  EXPECT_EQ(slurm_tasks_on_node("4(x2),3,1(x2)", 4), 1);
  for (const std::string bad : {"", "x", "2(x", "2(x0)", "2(y3)", "2,,1", "2(x3)junk"}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(slurm_tasks_on_node(bad, 0), std::nullopt);
  }
}

}  // namespace
}  // namespace flowtrain::parallel
