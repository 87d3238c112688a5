// Activation checkpointing (recompute): run a block (or one of its sublayers: selective
// checkpointing) without keeping its intermediate activations, and run it again in backward to
// get them. Only the block's inputs are kept, so a
// block's activation memory drops from O(tokens · hidden · ~15 tensors) to its input; the cost
// is one more forward of the block (~1/3 more compute for the checkpointed blocks).
//
// It composes with FSDP (parallel/fsdp.h): the FSDP unit's hook on the block output fires before
// the recompute and gathers the weights, and the recompute's gradients reach the parameters
// through their usual accumulators, so the reduce-scatter hooks fire as without checkpointing.
// With context parallelism the recompute repeats the attention's communication on every rank, in
// the same order.
#pragma once

#include "models/model.h"
#include "parallel/recompute.h"

#include <ATen/ATen.h>

#include <functional>

namespace flowtrain::parallel {

// call(inputs) with its activations recomputed in backward. The CPU random generator (and the
// device's, on CUDA) is restored before the recompute, so a block that draws random numbers
// (dropout) draws the same ones. `call` must stay callable until backward has run.
models::Tensors checkpointed_call(models::UnitCall call, const models::Tensors& inputs);

// What to checkpoint, from train.activation_checkpointing and _every: full recomputes whole
// blocks; attention / mlp (selective) recompute only that sublayer of a block
// (models::Sublayer), keeping the rest of its activations; none nothing. Applies to every
// `every`-th block, starting with block 0 (every = 1: all blocks).
bool checkpoint_block(RecomputePolicy policy, int64_t every, int64_t block_index);
bool checkpoint_sublayer(RecomputePolicy policy, int64_t every, int64_t block_index, models::Sublayer part);

}  // namespace flowtrain::parallel
