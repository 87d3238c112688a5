#include "trainer/config/resolve.h"

#include <ATen/Context.h>
#include <fmt/format.h>

#include <algorithm>
#include <thread>

namespace flowtrain::trainer {

std::string RunEnvironment::describe() const {
  return fmt::format("world {} ({} per machine), {} GPU{} and {} CPU cores a machine", world, ranks_per_node,
                     cuda_devices, cuda_devices == 1 ? "" : "s", cpu_cores);
}

RunEnvironment this_environment(const parallel::DistEnv& env) {
  RunEnvironment e;
  e.world = env.world;
  e.ranks_per_node = env.local_world;
  e.cuda_devices = at::hasCUDA() ? static_cast<int64_t>(at::getNumGPUs()) : 0;
  e.cpu_cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  return e;
}

c10::DeviceType resolve_device(const RunConfig& run, int64_t cuda_devices) {
  if (run.device == DeviceChoice::cpu || (run.device == DeviceChoice::automatic && cuda_devices == 0))
    return c10::kCPU;
  if (cuda_devices == 0) throw ConfigError("'run.device' is cuda but no CUDA device is available (use cpu or auto)");
  return c10::kCUDA;
}

void check_batch_split(const Config& c, int64_t data_parallel) {
  const int64_t batch = c.data.batch_size, accum = c.train.grad_accum;
  if (batch % (data_parallel * accum) == 0) return;
  if (data_parallel == 1)
    throw ConfigError(fmt::format("'data.batch_size' ({}) must be divisible by 'train.grad_accum' ({})", batch, accum));
  throw ConfigError(fmt::format("'data.batch_size' ({}) must be divisible by {} data-parallel ranks × 'train.grad_accum' "
                                "({})",
                                batch, data_parallel, accum));
}

ResolvedRun resolve(const Config& c, const RunEnvironment& env) {
  ResolvedRun r;
  r.device = resolve_device(c.run, env.cuda_devices);
  try {
    const parallel::Mesh mesh({c.parallel.dp_replicate, c.parallel.dp_shard, c.parallel.cp, c.parallel.cp_ulysses},
                              env.world);
    r.mesh = mesh.shape();
    r.data_parallel = mesh.data_parallel();
  } catch (const parallel::MeshError& e) {
    throw ConfigError(fmt::format("{} ({})", e.what(), env.describe()));
  }
  check_batch_split(c, r.data_parallel);
  r.micro_batch = c.data.batch_size / (r.data_parallel * c.train.grad_accum);
  r.sharded = env.world > 1 || c.parallel.fsdp == FsdpChoice::on;
  if (r.sharded) {
    const BackendChoice backend = c.parallel.backend != BackendChoice::automatic ? c.parallel.backend
                                  : r.device == c10::kCUDA                        ? BackendChoice::nccl
                                                                                  : BackendChoice::gloo;
    if (backend == BackendChoice::nccl && r.device != c10::kCUDA)
      throw ConfigError("'parallel.backend' nccl needs CUDA tensors, but the run is on the CPU ('run.device' " +
                        name_of(c.run.device) + "); use gloo or auto");
    r.backend = name_of(backend);
  }
  // Ranks sharing a machine share its cores: all-cores-each would oversubscribe them.
  r.threads = c.train.threads > 0 ? c.train.threads
              : r.device == c10::kCPU ? std::max<int64_t>(1, env.cpu_cores / env.ranks_per_node)
                                      : env.cpu_cores;
  r.model = {c.model.resolved_hidden(), c.model.resolved_depth(), c.model.resolved_heads()};
  return r;
}

namespace {
std::string count(int64_t n, const char* what) { return fmt::format("{} {}{}", n, what, n == 1 ? "" : "s"); }
}  // namespace

std::vector<std::pair<std::string, std::string>> ResolvedRun::lines(const Config& c) const {
  std::vector<std::pair<std::string, std::string>> out;
  out.emplace_back("device", device == c10::kCUDA ? "cuda" : "cpu");
  out.emplace_back("mesh", fmt::format("dp_replicate {} × dp_shard {} × cp {} ({})", mesh.dp_replicate, mesh.dp_shard,
                                       mesh.cp, count(data_parallel, "data-parallel rank")));
  out.emplace_back("sharding", sharded ? "FSDP over the mesh, " + backend + " collectives" : "none (one process)");
  out.emplace_back("batch", fmt::format("global {} = {} × {} × {}", c.data.batch_size,
                                        count(data_parallel, "data-parallel rank"),
                                        count(c.train.grad_accum, "micro-batch"), count(micro_batch, "sample")));
  if (mesh.cp > 1)  // the kind and the token split are decided with the built model (parallelize.h)
    out.emplace_back("context", fmt::format("{} ranks split each sample's tokens; attention {}", mesh.cp,
                                            name_of(c.parallel.cp_attention)));
  out.emplace_back("model", fmt::format("hidden {}, depth {}, heads {}", model.hidden, model.depth, model.heads));
  out.emplace_back("threads", count(threads, "intra-op CPU thread") + " per rank");
  return out;
}

}  // namespace flowtrain::trainer
