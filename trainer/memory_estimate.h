// Memory per rank, estimated from the config alone: what `flowtrain config` prints for a planned
// job (flux-dev at 8 or 64 GPUs) and `flowtrain bench` sets beside the peak it measures.
//
// From the model family's FSDP units (FamilySpec::footprint: each unit's parameters and what its
// training forward keeps per sample) and the resolved run (mesh, micro-batch, precision,
// activation checkpointing), it replays one training step's allocations:
//   persistent  fp32 master weights, AdamW's two moments, the EMA (each a 1/N shard of every
//               unit under FSDP over N = dp_shard · cp ranks), the frozen encoders' weights, and
//               on the CPU the FSDP buffers it recycles (gathered units, reduce slots) and the
//               asynchronous checkpoint's staging copy (host memory on CUDA: reported apart);
//   forward     every unit's kept activations (its input only under full checkpointing);
//   backward    unit by unit from the head: the activations of the units not yet reached, the
//               unit's own (recomputed when checkpointed) and its backward's gradient tensors,
//               the gradients made so far (unsharded fp32 on one process; under FSDP the
//               gathered unit and its prefetched neighbour, the unit's unsharded gradients,
//               the reduce buffers and the reduced fp32 shards);
//   optimizer   every gradient at once.
// The peak is the largest of these, plus (on the CPU) the data set held in memory. What it leaves out: the data loader's queue, the frozen
// encoders' forward working memory, kernels' workspaces and the allocator's rounding and
// fragmentation (CUDA's reserved bytes exceed the allocated bytes estimated here).
// Activations count 4 bytes an element in fp32 and 2 under bf16 autocast — an approximation
// there (norms and RoPE compute in fp32), checked on the CPU in fp32 only
// (tests/dist/test_memory_estimate.cpp, docs/perf.md).
#pragma once

#include "trainer/config/config.h"
#include "trainer/config/resolve.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace flowtrain::trainer {

struct MemoryEstimate {
  bool available = false;
  bool cuda = false;               // the run's device: host and device memory are apart
  std::string unavailable_reason;  // when not available: why (a family without footprints)
  // Bytes per rank on the run's device.
  int64_t weights = 0, optimizer = 0, ema = 0;  // fp32 master weights, AdamW m and v, EMA
  int64_t gradients = 0;                          // all of them, at the optimizer step
  int64_t frozen = 0;                             // the frozen encoders' weights
  bool frozen_counted = true;                     // false: a frozen model's files were not found
  int64_t fsdp_buffers = 0;   // CPU: the gathered-unit and reduce buffers FSDP keeps for reuse
  int64_t staging = 0;        // asynchronous checkpoint staging (on the CPU it is device memory)
  int64_t activations = 0;    // kept by the forward at its end (the micro-batch's)
  int64_t peak = 0;           // the step's largest live total on the device
  std::string peak_at;        // where: "backward of double_blocks.0", "optimizer step"
  int64_t host_staging = 0;   // CUDA: the staging copy in pinned host memory
  // The data set a run holds in memory (data.source fashion_mnist | compositions | synthetic; 0 for
  // streamed shards): device memory on the CPU, host memory on CUDA. −1: not counted.
  int64_t dataset = 0;
  // "key: value" lines for `flowtrain config`.
  std::vector<std::pair<std::string, std::string>> lines() const;
};

// `dataset_bytes`: the size of the data set the run holds in memory (data.source other than
// shards), when the caller knows it (bench: the one it built); −1 leaves it out, said in lines().
MemoryEstimate estimate_memory(const Config& config, const ResolvedRun& run, int64_t dataset_bytes = -1);

}  // namespace flowtrain::trainer
