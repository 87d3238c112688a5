// Deliberately wrong gradient reductions, for the tests that must show the equivalence checks
// catch each reduction factor (config debug.inject.reduction, refused unless
// debug.allow_inject; parallel/fsdp.h applies them). Apart from fsdp.h so the config can hold one.
#pragma once

namespace flowtrain::parallel {

enum class ReductionFault {
  None,               // none
  SumOverShardGroup,  // sum_over_shard_group: sum instead of the data-parallel mean: gradients × (dp_shard · cp)
  NoContextSum,       // no_context_sum: the × cp for context ranks' partial sums skipped: gradients ÷ cp
  SumOverReplicas,    // sum_over_replicas: HSDP replicas summed instead of averaged: gradients × dp_replicate
};

}  // namespace flowtrain::parallel
