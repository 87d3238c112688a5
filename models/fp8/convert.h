// Which linears of a model compute in fp8 (`fp8.include`, `fp8.exclude`, `fp8.min_dim`), and
// the once-a-step bookkeeping of delayed scaling.
#pragma once

#include "models/fp8/fp8_linear.h"

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace flowtrain::models::fp8 {

struct Fp8Options {
  Recipe recipe = Recipe::none;
  bool emulate = false;
  // Glob patterns ('*' matches anything, dots included) over module names ("blocks.3.attn.qkv").
  // A linear converts when it matches an include and no exclude. (The defaults a run uses are
  // the config's, trainer/config/config.h Fp8Config.)
  std::vector<std::string> include, exclude;
  int64_t min_dim = 1;  // both in and out features at least this
  bool require_multiple_of_16 = false;  // hardware fp8 GEMMs: in and out features % 16 == 0
  DelayedOptions delayed;
};

struct Fp8Conversion {
  std::vector<std::string> converted;
  std::vector<std::string> skipped;  // "name (why)" for linears the patterns chose but the size rules refused
  std::vector<std::shared_ptr<Fp8Linear>> layers;  // converted, in module order
  // One line for the log: the recipe, how many converted, their names (compressed over blocks).
  std::string summary(const Fp8Options& options) const;
};

bool glob_match(const std::string& pattern, const std::string& name);

// Gives every chosen Linear of `model` an Fp8Linear backend (recipe none: nothing changes).
Fp8Conversion convert_linears(torch::nn::Module& model, const Fp8Options& options);

// Delayed scaling, once per optimizer step: every converted layer's pending amaxes, stacked into
// one tensor, reduced in place by `reduce_max` (an all-reduce MAX over the ranks that share the
// model — FSDP shards and context-parallel ranks — so every rank derives the same scales;
// nothing on one process) and appended to the histories. A no-op for the other recipes.
void commit_amax_histories(const Fp8Conversion& conversion, const std::function<void(at::Tensor&)>& reduce_max);

// A step whose update is skipped (a non-finite loss or gradient) leaves no trace in the
// histories either: its pending amaxes are dropped.
void discard_pending_amaxes(const Fp8Conversion& conversion);

// Delayed scaling's state, for a checkpoint: "<linear>.amax_history" ([history_len, 3] fp32,
// newest first) and "<linear>.amax_commits" (int64 scalar) of every converted layer that has
// committed a step — identical on every rank, since the amaxes were reduced over all of them.
// Empty for the other recipes.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;
NamedTensors amax_history_state(const Fp8Conversion& conversion);

// Puts a saved state back into the layers of the same name and returns how many were restored.
// Every delayed layer is reset first (a rollback leaves nothing of the abandoned steps); those
// the state does not name (another fp8.include, a checkpoint of a run without delayed
// scaling) start afresh, scaling dynamically until their first commit; state of layers this
// model did not convert is ignored. Throws std::invalid_argument naming the entry that is
// malformed.
int64_t restore_amax_histories(const Fp8Conversion& conversion, const NamedTensors& state);

}  // namespace flowtrain::models::fp8
