// The process's distributed runtime: rendezvous through a c10d TCPStore (rank 0 hosts it at
// MASTER_ADDR:MASTER_PORT), the world process group, and one group per mesh dimension this rank
// belongs to. Gloo on CPU, NCCL on CUDA (one process per GPU, LOCAL_RANK picks the device).
//
// Start-up checks: every rank publishes its WORLD_SIZE and rank in the store; disagreement (a
// wrong WORLD_SIZE on one node) or a duplicate rank is an error naming the variable. A rank that
// never arrives makes every other rank fail with a timeout after parallel.timeout_s.
#pragma once

#include "parallel/comm.h"
#include "parallel/env.h"
#include "parallel/mesh.h"

#include <c10/core/Device.h>

#include <memory>

namespace flowtrain::parallel {

struct RuntimeOptions {
  DistEnv env;
  MeshShape mesh;
  std::string backend = "gloo";  // gloo | nccl (c10d's names)
  double timeout_s = 600;
  c10::Device device = c10::Device(c10::kCPU);
};

class Runtime {
 public:
  virtual ~Runtime() = default;
  static std::unique_ptr<Runtime> create(const RuntimeOptions& options);

  virtual int64_t rank() const = 0;
  virtual int64_t world() const = 0;
  virtual const Mesh& mesh() const = 0;
  virtual const std::string& backend() const = 0;  // "gloo" | "nccl"
  virtual Comm& world_group() = 0;
  virtual Comm& shard_group() = 0;
  virtual Comm& replicate_group() = 0;
  virtual Comm& context_group() = 0;
  // The hybrid split of the context group (mesh cp_ulysses strictly between 1 and cp; see
  // mesh.h). Throws std::logic_error on a mesh without one.
  virtual Comm& context_ulysses_group() = 0;
  virtual Comm& context_ring_group() = 0;
  // All ranks, always Gloo (also under NCCL): checkpoint commits vote here from a background
  // thread, apart from the training groups, so they never collide with training collectives.
  virtual Comm& checkpoint_group() = 0;
  // Releases the process groups (NCCL needs an explicit shutdown before exit).
  virtual void shutdown() = 0;
};

}  // namespace flowtrain::parallel
