// What activation checkpointing recomputes (train.activation_checkpointing): apart from
// parallel/activation_checkpoint.h so the config can hold it.
#pragma once

namespace flowtrain::parallel {

enum class RecomputePolicy {
  none,       // store every activation
  full,       // recompute the selected blocks whole in backward
  attention,  // recompute only the attention sublayer of the selected blocks (selective)
  mlp,        // recompute only the MLP sublayer of the selected blocks (selective)
};

}  // namespace flowtrain::parallel
