// Parallelising a built model: context parallelism (attention across the context group and the
// token sequence split), FSDP units, activation checkpointing. Each model family's spec names
// the function that does it for its model (trainer/family.h, FamilySpec::parallelize), as
// TorchTitan's parallelize_fn: the train states only hold what it returns.
#pragma once

#include "models/linear.h"
#include "models/model.h"
#include "parallel/context.h"
#include "parallel/fsdp.h"
#include "parallel/runtime.h"
#include "trainer/config/config.h"

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace flowtrain::trainer {

struct ParallelizeInputs {
  const Config* config = nullptr;
  parallel::Runtime* runtime = nullptr;  // null: one process, nothing sharded
  // fp8 all-gather's weights (trainer/fp8_setup.h fp8_all_gather_weights), or empty.
  std::map<std::string, std::shared_ptr<models::PrecastWeight>> fp8_weights;
  // With parallel.cp > 1: the attention kind to install, context_attention_kind's answer for
  // this model (checked before the run directory is written).
  std::optional<parallel::ContextAttention> context_attention;
};

struct Parallelized {
  // The FSDP wrapper that owns the model's flat parameter shards; null on one process. The train
  // state calls it around each micro-batch and gives its shards to AdamW and the EMA.
  std::unique_ptr<parallel::FullyShardedModule> fsdp;
};

using ParallelizeFn = std::function<Parallelized(models::DiffusionModel& model, ParallelizeInputs inputs)>;

// The order the transformer families share (TorchTitan's llama/flux order):
//   1. context parallelism: every block's attention spans the context group, and the token
//      sequence is split after the embedders and gathered before it leaves the model;
//   2. FSDP: the model's units (stem, one per block, head) sharded over the shard group, each
//      gathered around its forward and backward, gradients reduce-scattered;
//   3. activation checkpointing inside each unit's gathered weights (full blocks through the
//      unit runner, or one sublayer through the sublayer runner).
// On one process only 3 applies. The model must already be on its device.
Parallelized parallelize_transformer(models::DiffusionModel& model, ParallelizeInputs inputs);

// The context-parallel attention for parallel.cp > 1: parallel.cp_attention, auto resolved (ulysses
// when the heads split over parallel.cp, else ring). Throws ConfigError when the model's tokens
// per sample do not split evenly over parallel.cp (each token stream on its own), or Ulysses is
// asked for and the heads do not split over parallel.cp (hybrid: over parallel.cp_ulysses).
parallel::ContextAttention context_attention_kind(const Config& config, const models::DiffusionModel& model);

// One block's forward in training: under activation checkpointing (recomputed in backward)
// when train.activation_checkpointing selects block `index` and gradients are being recorded,
// else a plain call.
models::Tensors run_unit(const TrainConfig& train, int64_t index, const models::UnitCall& call,
                         const models::Tensors& inputs);

// Selective activation checkpointing (train.activation_checkpointing attention | mlp): the
// model's sublayer runner that recomputes the chosen sublayer of the selected blocks. Empty for
// the other modes.
models::SublayerRunner sublayer_checkpointing(const TrainConfig& train);

}  // namespace flowtrain::trainer
