// What one FSDP unit of a model holds in training, counted from its layer shapes without building
// it: the numbers trainer/memory_estimate.h turns into bytes per rank for `flowtrain config` and
// `flowtrain bench`. Element counts are per sample of the micro-batch.
//
// "Saved" means what autograd keeps from the forward for the backward (inputs of linears and
// norms, nonlinearities' inputs, attention's kept tensors), counted tensor by tensor where each is
// made (a view shares its base: counted once). Which tensors the attention keeps depends on the
// kernel: the math path of short CPU sequences keeps the softmax probabilities (H·T² a sample),
// SDPA's flash kernels keep their output and the log-sum-exp (H·T).
#pragma once

#include <cstdint>
#include <string>

namespace flowtrain::models {

struct UnitFootprint {
  std::string name;          // the FSDP unit: "stem", "double_blocks.3", "head"
  int64_t parameters = 0;    // trainable
  int64_t fixed = 0;         // parameters not trained (DiT's pos_embed): not sharded, every rank holds them
  double saved = 0;          // elements kept for backward, nothing recomputed
  double input = 0;          // elements of the unit's inputs: what full activation checkpointing keeps
  double attention = 0;      // of `saved`, what checkpointing the attention sublayer recomputes
  double mlp = 0;            // of `saved`, what checkpointing the MLP sublayer recomputes
  // The largest gradient tensors alive together inside the unit's backward (the incoming gradient,
  // the widest intermediate's, the attention's score gradients on the math path).
  double backward_working = 0;
};

// How the attention kernels of a run keep their state (see the top of this file).
enum class AttentionSaves { Probabilities, LogSumExp };

}  // namespace flowtrain::models
