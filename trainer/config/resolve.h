// What a config means where it runs: every "auto", 0 and −1 of the config turned into the value
// the run uses, and every rule that ties keys to the environment (world size, GPUs, cores)
// checked, in one place. The Trainer starts from resolve()'s result; `flowtrain config` prints it
// (for this process, or for a planned world with --world); Config::validate() checks the same
// rules at world 1 when a config is loaded.
//
// Rules that need the built model (how its token streams split over parallel.cp) stay with the
// model's parallelisation (trainer/parallelize.h), which gets the resolved values from here.
#pragma once

#include "parallel/env.h"
#include "parallel/mesh.h"
#include "trainer/config/config.h"
#include "trainer/family.h"

#include <c10/core/DeviceType.h>

#include <string>
#include <utility>
#include <vector>

namespace flowtrain::trainer {

// The facts of the environment a run's config is resolved against.
struct RunEnvironment {
  int64_t world = 1;          // ranks in the job
  int64_t ranks_per_node = 1;  // ranks sharing one machine (its cores and GPUs)
  int64_t cuda_devices = 0;   // GPUs visible on a machine
  int64_t cpu_cores = 1;      // cores of a machine
  std::string describe() const;
};

// This process's environment: the launch variables (Slurm, torchrun, Kubernetes, `flowtrain
// launch`; world 1 without them), the GPUs this process sees and the machine's cores.
RunEnvironment this_environment(const parallel::DistEnv& env);

struct ResolvedRun {
  c10::DeviceType device = c10::kCPU;  // run.device auto: CUDA when a GPU is visible
  parallel::MeshShape mesh;            // parallel.dp_shard −1 resolved
  int64_t data_parallel = 1;           // ranks that split each global batch (dp_replicate × dp_shard)
  bool sharded = false;                // FSDP: world > 1, or parallel.fsdp on
  std::string backend;                 // collectives when sharded: nccl | gloo ("" otherwise)
  int64_t micro_batch = 0;             // samples a rank computes per micro-batch
  int64_t threads = 1;                 // intra-op CPU threads per rank
  ModelPreset model;                   // model.hidden/depth/heads after the size preset

  // "key: value" lines of everything above, for `flowtrain config` and the run's start.
  std::vector<std::pair<std::string, std::string>> lines(const Config& config) const;
};

// Resolves `config` for `env`; throws ConfigError naming the keys (and the environment) of the
// first rule that fails.
ResolvedRun resolve(const Config& config, const RunEnvironment& env);

// The rules that resolve() and Config::validate() share.
// run.device → the device kind; throws when cuda is asked for and `cuda_devices` is 0.
c10::DeviceType resolve_device(const RunConfig& run, int64_t cuda_devices);
// data.batch_size splits evenly into `data_parallel` ranks × train.grad_accum micro-batches.
void check_batch_split(const Config& config, int64_t data_parallel);

}  // namespace flowtrain::trainer
