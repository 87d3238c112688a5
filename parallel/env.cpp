#include "parallel/env.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>

namespace flowtrain::parallel {

namespace {

// ---------------------------------------------------------------- variables, checked on read

// A resolved integer together with where it came from, so a consistency error can say
// "SLURM_PROCID=4 is not below SLURM_NTASKS=4" rather than "rank 4 >= world 4".
struct Field {
  int64_t value = 0;
  std::string label;  // "RANK=3", or "local world 2 (SLURM_NTASKS / SLURM_NNODES)"
};

class Vars {
 public:
  explicit Vars(const EnvLookup& env) : env_(env) {}

  std::optional<std::string> str(const std::string& name) const {
    std::optional<std::string> v = env_(name);
    if (v && v->empty()) return std::nullopt;  // `export RANK=` clears a variable
    return v;
  }
  bool has(const std::string& name) const { return str(name).has_value(); }

  // The variable as an integer >= min, or nullopt when unset; throws naming it otherwise.
  std::optional<Field> integer(const std::string& name, int64_t min = 0) const {
    std::optional<std::string> s = str(name);
    if (!s) return std::nullopt;
    int64_t value = 0;
    const char* end = s->data() + s->size();
    auto [ptr, ec] = std::from_chars(s->data(), end, value);
    if (ec != std::errc() || ptr != end) throw DistEnvError(fmt::format("{}=\"{}\" is not an integer", name, *s));
    if (value < min) throw DistEnvError(fmt::format("{}={} must be >= {}", name, value, min));
    return Field{value, fmt::format("{}={}", name, value)};
  }

  // The first of `names` that is set, as a string, with the name that supplied it.
  std::optional<std::pair<std::string, std::string>> first_of(std::initializer_list<const char*> names) const {
    for (const char* name : names)
      if (auto v = str(name)) return std::make_pair(std::string(name), *v);
    return std::nullopt;
  }

 private:
  const EnvLookup& env_;
};

void check_below(const Field& index, const Field& count) {
  if (index.value >= count.value) throw DistEnvError(fmt::format("{} is not below {}", index.label, count.label));
}

int port_from(const Field& port) {
  if (port.value < 1 || port.value > 65535)
    throw DistEnvError(fmt::format("{} is not a TCP port (1..65535)", port.label));
  return static_cast<int>(port.value);
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1" || addr == "[::1]";
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Checks every index against its count; the labels carry the variable names into the message.
void check_consistent(const Field& rank, const Field& world, const Field& local_rank, const Field& local_world,
                      const Field& node_rank, const Field& num_nodes) {
  check_below(rank, world);
  check_below(local_rank, local_world);
  check_below(node_rank, num_nodes);
  if (local_world.value > world.value)
    throw DistEnvError(fmt::format("{} is larger than {}", local_world.label, world.label));
}

// ---------------------------------------------------------------- Slurm (srun)

DistEnv from_slurm(const Vars& v) {
  DistEnv e;
  e.source = "slurm";
  const Field rank = *v.integer("SLURM_PROCID");
  const std::optional<Field> world = v.integer("SLURM_NTASKS", 1);
  if (!world)
    throw DistEnvError(
        fmt::format("{} is set but SLURM_NTASKS is not (run the job step with srun -n/--ntasks)", rank.label));

  // The step's node list: rank 0 runs on its first node. The job's list can be larger than the
  // step's (srun -N1 inside a 4-node allocation), so it is only the fallback.
  auto nodelist = v.first_of({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  auto with_name = [&](auto&& f) {  // hostlist errors name the variable that held the list
    try {
      return f(nodelist->second);
    } catch (const DistEnvError& err) {
      throw DistEnvError(fmt::format("{}: {}", nodelist->first, err.what()));
    }
  };

  Field num_nodes{1, "1 node (SLURM_NNODES unset)"};
  if (auto n = v.integer("SLURM_NNODES", 1)) {
    num_nodes = *n;
  } else if (nodelist) {
    const int64_t n = with_name(count_slurm_hosts);
    num_nodes = {n, fmt::format("{} nodes in {}", n, nodelist->first)};
  }

  Field node_rank{0, "node 0 (SLURM_NODEID unset)"};
  if (auto n = v.integer("SLURM_NODEID")) {
    node_rank = *n;
  } else if (num_nodes.value > 1) {
    throw DistEnvError(fmt::format("SLURM_NODEID is not set although {}", num_nodes.label));
  }

  // Ranks on this node. The step's layout (what srun actually started) beats the requested
  // --ntasks-per-node, which beats the job's layout; the uniform split is the last resort.
  std::optional<Field> local_world;
  if (auto s = v.str("SLURM_STEP_TASKS_PER_NODE"))
    if (auto n = slurm_tasks_on_node(*s, node_rank.value))
      local_world = Field{
          *n, fmt::format("local world {} (SLURM_STEP_TASKS_PER_NODE=\"{}\" on node {})", *n, *s, node_rank.value)};
  if (!local_world) local_world = v.integer("SLURM_NTASKS_PER_NODE", 1);
  if (!local_world)
    if (auto s = v.str("SLURM_TASKS_PER_NODE"))
      if (auto n = slurm_tasks_on_node(*s, node_rank.value))
        local_world =
            Field{*n, fmt::format("local world {} (SLURM_TASKS_PER_NODE=\"{}\" on node {})", *n, *s, node_rank.value)};
  if (!local_world) {
    // Rounded up: with an uneven split the busiest node has the most ranks, and a local rank
    // must stay below it.
    const int64_t n = ceil_div(world->value, num_nodes.value);
    local_world = Field{n, fmt::format("local world {} ({} / {})", n, world->label, num_nodes.label)};
  }

  Field local_rank;
  if (auto n = v.integer("SLURM_LOCALID")) {
    local_rank = *n;
  } else if (num_nodes.value == 1) {
    local_rank = {rank.value, "local rank " + std::to_string(rank.value) + " (SLURM_LOCALID unset, one node)"};
  } else {
    throw DistEnvError(fmt::format("SLURM_LOCALID is not set although {}", num_nodes.label));
  }
  check_consistent(rank, *world, local_rank, *local_world, node_rank, num_nodes);

  if (auto addr = v.str("MASTER_ADDR")) {
    e.master_addr = *addr;
  } else if (nodelist) {
    e.master_addr = with_name(first_slurm_host);
  } else if (num_nodes.value > 1) {
    throw DistEnvError(
        fmt::format("SLURM_JOB_NODELIST (or SLURM_STEP_NODELIST, SLURM_NODELIST, MASTER_ADDR) "
                    "is not set although {}: cannot tell where rank 0 runs",
                    num_nodes.label));
  }
  if (auto port = v.integer("MASTER_PORT")) {
    e.master_port = port_from(*port);
  } else if (auto job = v.integer("SLURM_JOB_ID")) {
    e.master_port = slurm_master_port(job->value);
  }

  e.rank = rank.value;
  e.world = world->value;
  e.local_rank = local_rank.value;
  e.local_world = local_world->value;
  e.node_rank = node_rank.value;
  e.num_nodes = num_nodes.value;
  return e;
}

// ---------------------------------------------------------------- torchrun, PyTorchJob, Indexed Job

// `source` is "torchrun" (rank from RANK) or "k8s-indexed-job" (rank from JOB_COMPLETION_INDEX).
// `launcher` names what promised the variables, for the message when one is missing.
DistEnv from_torchrun(const Vars& v, const std::string& source, const std::string& launcher) {
  DistEnv e;
  e.source = source;
  const bool indexed = source == "k8s-indexed-job";
  const std::string rank_name = indexed ? "JOB_COMPLETION_INDEX" : "RANK";
  const std::optional<Field> rank = v.integer(rank_name);
  if (!rank) throw DistEnvError(fmt::format("{} but RANK is not set", launcher));
  const std::optional<Field> world = v.integer("WORLD_SIZE", 1);
  if (!world) throw DistEnvError(fmt::format("{} is set but WORLD_SIZE is not", rank->label));

  const std::optional<std::string> master_addr = v.str("MASTER_ADDR");
  const std::optional<Field> master_port = v.integer("MASTER_PORT");
  if (indexed && !master_addr)
    throw DistEnvError(
        fmt::format("{} is set but MASTER_ADDR is not (the manifest sets it to "
                    "<job>-0.<headless-service>)",
                    rank->label));
  if (indexed && !master_port) throw DistEnvError(fmt::format("{} is set but MASTER_PORT is not", rank->label));
  if (!master_addr && world->value > 1)
    throw DistEnvError(fmt::format("{} but MASTER_ADDR is not set: the ranks cannot find rank 0", world->label));

  // How many ranks share this node. torchrun says so (LOCAL_WORLD_SIZE, or WORLD_SIZE /
  // GROUP_WORLD_SIZE). Otherwise: a loopback master means one host holding every rank; a remote
  // master without LOCAL_RANK is the PyTorchJob / Indexed Job layout of one rank per pod.
  const std::optional<Field> local_rank_var = v.integer("LOCAL_RANK");
  const std::optional<Field> group_world = v.integer("GROUP_WORLD_SIZE", 1);
  Field local_world;
  if (auto n = v.integer("LOCAL_WORLD_SIZE", 1)) {
    local_world = *n;
  } else if (group_world) {
    if (world->value % group_world->value != 0)
      throw DistEnvError(fmt::format("{} is not a multiple of {}", world->label, group_world->label));
    const int64_t n = world->value / group_world->value;
    local_world = {n, fmt::format("local world {} ({} / {})", n, world->label, group_world->label)};
  } else if (!master_addr || is_loopback(*master_addr)) {
    local_world = {world->value, fmt::format("local world {} (one host: MASTER_ADDR={})", world->value,
                                             master_addr.value_or("unset"))};
  } else if (!local_rank_var) {
    local_world = {1, "local world 1 (one rank per pod: no LOCAL_RANK, remote MASTER_ADDR)"};
  } else {
    throw DistEnvError(
        fmt::format("{} is set but LOCAL_WORLD_SIZE is not, and MASTER_ADDR={} is not loopback: "
                    "cannot tell how many ranks share this node",
                    local_rank_var->label, *master_addr));
  }

  // torchrun numbers ranks node by node, so the rest follows from the rank when not given.
  Field local_rank = local_rank_var.value_or(
      Field{rank->value % local_world.value,
            fmt::format("local rank {} ({} mod local world)", rank->value % local_world.value, rank->label)});
  Field num_nodes = group_world.value_or(Field{
      ceil_div(world->value, local_world.value),
      fmt::format("{} nodes ({} / {})", ceil_div(world->value, local_world.value), world->label, local_world.label)});
  std::optional<Field> node_rank = v.integer("GROUP_RANK");
  if (!node_rank) node_rank = v.integer("NODE_RANK");
  if (!node_rank)
    node_rank = Field{rank->value / local_world.value,
                      fmt::format("node {} ({} / local world)", rank->value / local_world.value, rank->label)};
  check_consistent(*rank, *world, local_rank, local_world, *node_rank, num_nodes);

  if (master_addr) e.master_addr = *master_addr;
  if (master_port) e.master_port = port_from(*master_port);
  if (auto agent_store = v.str("TORCHELASTIC_USE_AGENT_STORE")) {
    // PyTorch compares with str(True); anything else torchrun writes is "False".
    if (*agent_store != "True" && *agent_store != "False")
      throw DistEnvError(fmt::format("TORCHELASTIC_USE_AGENT_STORE=\"{}\" is neither True nor False", *agent_store));
    e.launcher_store = *agent_store == "True";
  }
  if (auto attempt = v.integer("TORCHELASTIC_RESTART_COUNT")) e.store_attempt = attempt->value;
  e.rank = rank->value;
  e.world = world->value;
  e.local_rank = local_rank.value;
  e.local_world = local_world.value;
  e.node_rank = node_rank->value;
  e.num_nodes = num_nodes.value;
  return e;
}

// ---------------------------------------------------------------- Slurm hostlists

struct Range {
  int64_t lo, hi;
  size_t width;  // zero padding: the width of the low end as written ("003-010" → 3)
};
// One piece of a host name: a literal, or a bracket group (ranges non-empty).
struct Piece {
  std::string literal;
  std::vector<Range> ranges;
};
using HostPattern = std::vector<Piece>;  // "r[1-2]n[01-04]" → "r", [1-2], "n", [01-04]

int64_t parse_number(const std::string& digits, const std::string& nodelist) {
  if (digits.empty() || digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); }))
    throw DistEnvError(fmt::format("malformed hostlist \"{}\": \"{}\" is not a number", nodelist, digits));
  return std::stoll(digits);
}

std::vector<Range> parse_bracket(const std::string& body, const std::string& nodelist) {
  std::vector<Range> ranges;
  size_t start = 0;
  while (true) {
    const size_t comma = body.find(',', start);
    const std::string item = body.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t dash = item.find('-');
    Range r{};
    r.lo = parse_number(item.substr(0, dash), nodelist);
    r.hi = dash == std::string::npos ? r.lo : parse_number(item.substr(dash + 1), nodelist);
    r.width = dash == std::string::npos ? item.size() : dash;
    if (r.hi < r.lo)
      throw DistEnvError(fmt::format("malformed hostlist \"{}\": range \"{}\" runs backwards", nodelist, item));
    ranges.push_back(r);
    if (comma == std::string::npos) return ranges;
    start = comma + 1;
  }
}

std::vector<HostPattern> parse_hostlist(const std::string& nodelist) {
  std::vector<HostPattern> hosts(1);
  for (size_t i = 0; i < nodelist.size(); ++i) {
    const char c = nodelist[i];
    if (c == ',') {
      if (hosts.back().empty()) throw DistEnvError(fmt::format("malformed hostlist \"{}\": empty host name", nodelist));
      hosts.emplace_back();
    } else if (c == '[') {
      const size_t close = nodelist.find(']', i);
      if (close == std::string::npos)
        throw DistEnvError(fmt::format("malformed hostlist \"{}\": unclosed '['", nodelist));
      hosts.back().push_back(Piece{"", parse_bracket(nodelist.substr(i + 1, close - i - 1), nodelist)});
      i = close;
    } else if (c == ']' || std::isspace(static_cast<unsigned char>(c))) {
      throw DistEnvError(fmt::format("malformed hostlist \"{}\": unexpected '{}'", nodelist, c));
    } else {
      if (hosts.back().empty() || !hosts.back().back().ranges.empty()) hosts.back().push_back(Piece{});
      hosts.back().back().literal += c;
    }
  }
  if (hosts.back().empty()) throw DistEnvError(fmt::format("malformed hostlist \"{}\": empty host name", nodelist));
  return hosts;
}

int64_t count_pattern(const HostPattern& host) {
  int64_t n = 1;
  for (const Piece& piece : host) {
    if (piece.ranges.empty()) continue;
    int64_t k = 0;
    for (const Range& r : piece.ranges) k += r.hi - r.lo + 1;
    n *= k;
    if (n > (int64_t{1} << 40)) throw DistEnvError("hostlist describes an absurd number of hosts");
  }
  return n;
}

std::string padded(int64_t value, size_t width) {
  std::string s = std::to_string(value);
  return s.size() < width ? std::string(width - s.size(), '0') + s : s;
}

// Appends every host of `host` (the last bracket group varies fastest, as Slurm expands them).
void expand_pattern(const HostPattern& host, size_t piece, const std::string& prefix, std::vector<std::string>& out) {
  if (piece == host.size()) {
    out.push_back(prefix);
    return;
  }
  const Piece& p = host[piece];
  if (p.ranges.empty()) return expand_pattern(host, piece + 1, prefix + p.literal, out);
  for (const Range& r : p.ranges)
    for (int64_t i = r.lo; i <= r.hi; ++i) expand_pattern(host, piece + 1, prefix + padded(i, r.width), out);
}

}  // namespace

std::string DistEnv::describe() const {
  std::string line = fmt::format("rank {}/{} (local {}/{}, node {}/{}) via {}, master {}:{}", rank, world, local_rank,
                                 local_world, node_rank, num_nodes, source, master_addr, master_port);
  if (restart_count > 0) line += fmt::format(", restart {}", restart_count);
  if (launcher_store) line += fmt::format(", store hosted by the launcher (attempt {})", store_attempt);
  return line;
}

DistEnv resolve_dist_env(const EnvLookup& lookup) {
  const Vars v(lookup);
  DistEnv e;
  // (a) A launcher inside a Slurm step leaves the step's SLURM_* variables in every rank's
  // environment; they describe the launcher (one task per node), so the launcher's own
  // variables must win. torchrun is recognised by TORCHELASTIC_RUN_ID, which it always sets.
  if (v.str("FLOWTRAIN_LAUNCH") == "1") {
    e = from_torchrun(v, "torchrun", "FLOWTRAIN_LAUNCH=1 (started by flowtrain launch)");
  } else if (auto run_id = v.str("TORCHELASTIC_RUN_ID")) {
    e = from_torchrun(v, "torchrun", fmt::format("TORCHELASTIC_RUN_ID={} (started by torchrun)", *run_id));
  } else if (v.has("SLURM_PROCID")) {
    e = from_slurm(v);
  } else if (v.has("RANK")) {
    e = from_torchrun(v, "torchrun", "");
  } else if (v.has("JOB_COMPLETION_INDEX")) {
    e = from_torchrun(v, "k8s-indexed-job", "");
  } else if (auto world = v.str("WORLD_SIZE")) {
    throw DistEnvError(
        fmt::format("WORLD_SIZE={} is set but RANK is not (nor SLURM_PROCID, JOB_COMPLETION_INDEX)", *world));
  }
  // A requeued Slurm job restarts whatever it ran, `flowtrain launch` included.
  if (auto restarts = v.integer("SLURM_RESTART_COUNT")) e.restart_count = restarts->value;
  return e;
}

DistEnv resolve_dist_env_from_process() {
  return resolve_dist_env([](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (!value) return std::nullopt;
    return std::string(value);
  });
}

std::string first_slurm_host(const std::string& nodelist) {
  if (nodelist.empty()) throw DistEnvError("empty hostlist");
  const std::vector<HostPattern> hosts = parse_hostlist(nodelist);
  std::string name;
  for (const Piece& piece : hosts.front())
    name += piece.ranges.empty() ? piece.literal : padded(piece.ranges[0].lo, piece.ranges[0].width);
  return name;
}

int64_t count_slurm_hosts(const std::string& nodelist) {
  if (nodelist.empty()) return 0;
  int64_t n = 0;
  for (const HostPattern& host : parse_hostlist(nodelist)) n += count_pattern(host);
  return n;
}

std::vector<std::string> expand_slurm_hosts(const std::string& nodelist) {
  std::vector<std::string> out;
  if (nodelist.empty()) return out;
  if (count_slurm_hosts(nodelist) > 1000000)
    throw DistEnvError(fmt::format("hostlist \"{}\" is too large to expand", nodelist));
  for (const HostPattern& host : parse_hostlist(nodelist)) expand_pattern(host, 0, "", out);
  return out;
}

std::optional<int64_t> slurm_tasks_on_node(const std::string& tasks_per_node, int64_t node) {
  // "2(x3),1": two tasks on each of three nodes, then one. The whole string is checked before
  // answering, so a garbled value is never half-trusted.
  std::vector<std::pair<int64_t, int64_t>> runs;  // (tasks, nodes)
  size_t start = 0;
  while (true) {
    size_t comma = tasks_per_node.find(',', start);
    if (comma == std::string::npos) comma = tasks_per_node.size();
    const std::string item = tasks_per_node.substr(start, comma - start);
    int64_t tasks = 0, repeat = 1;
    const char* end = item.data() + item.size();
    auto [ptr, ec] = std::from_chars(item.data(), end, tasks);
    if (ec != std::errc() || tasks < 0) return std::nullopt;
    if (ptr != end) {
      const std::string rest(ptr, end);  // "(x3)"
      if (rest.size() < 4 || rest.compare(0, 2, "(x") != 0 || rest.back() != ')') return std::nullopt;
      const char* r_end = rest.data() + rest.size() - 1;
      auto [r_ptr, r_ec] = std::from_chars(rest.data() + 2, r_end, repeat);
      if (r_ec != std::errc() || r_ptr != r_end || repeat < 1) return std::nullopt;
    }
    runs.emplace_back(tasks, repeat);
    if (comma == tasks_per_node.size()) break;
    start = comma + 1;
  }
  if (node < 0) return std::nullopt;
  for (const auto& [tasks, repeat] : runs) {
    if (node < repeat) return tasks;
    node -= repeat;
  }
  return std::nullopt;
}

int slurm_master_port(int64_t job_id) { return static_cast<int>(10000 + job_id % 20000); }

}  // namespace flowtrain::parallel
