#include "trainer/parallelize.h"

#include "models/layers.h"
#include "parallel/activation_checkpoint.h"
#include "parallel/context.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace flowtrain::trainer {

namespace {

parallel::FsdpOptions fsdp_options(const Config& c) {
  parallel::FsdpOptions o;
  o.reshard_after_forward = c.parallel.reshard_after_forward;
  o.prefetch = c.parallel.prefetch;
  o.compute_dtype = c.train.bf16_autocast() ? at::kBFloat16 : at::kFloat;
  o.reduce_dtype = c.parallel.reduce_dtype == Precision::bf16 ? at::kBFloat16 : at::kFloat;
  o.reduce_every_micro_batch = c.parallel.reduce_every_micro_batch;
  o.context_parallel = c.parallel.cp;
  o.fault = c.debug.reduction;  // the config refuses it unless debug.allow_inject
  return o;
}

}  // namespace

parallel::ContextAttention context_attention_kind(const Config& c, const models::DiffusionModel& model) {
  const int64_t cp = c.parallel.cp, tokens = model.tokens_per_sample(), heads = model.attention_heads();
  const std::vector<int64_t> streams = model.token_streams();
  for (const int64_t stream : streams)
    if (stream % cp != 0)
      throw ConfigError(fmt::format("'parallel.cp' {} does not split the model's {} tokens ({}) evenly{}", cp, tokens,
                                    model.token_layout(),
                                    streams.size() > 1 ? fmt::format(": each stream ({}) is split on its own",
                                                                     fmt::join(streams, " + "))
                                                       : ""));
  const bool heads_split = heads % cp == 0;
  if (c.parallel.cp_attention == CpAttentionChoice::ulysses && !heads_split)
    throw ConfigError(fmt::format("'parallel.cp_attention' ulysses needs the {} heads to split over 'parallel.cp' {}; "
                                  "use ring (or auto)",
                                  heads, cp));
  if (c.parallel.cp_attention == CpAttentionChoice::hybrid && heads % c.parallel.cp_ulysses != 0)
    throw ConfigError(fmt::format("'parallel.cp_attention' hybrid needs the {} heads to split over 'parallel.cp_ulysses' "
                                  "{}",
                                  heads, c.parallel.cp_ulysses));
  switch (c.parallel.cp_attention) {
    case CpAttentionChoice::automatic: break;
    case CpAttentionChoice::ulysses: return parallel::ContextAttention::Ulysses;
    case CpAttentionChoice::ring: return parallel::ContextAttention::Ring;
    case CpAttentionChoice::hybrid: return parallel::ContextAttention::Hybrid;
  }
  return heads_split ? parallel::ContextAttention::Ulysses : parallel::ContextAttention::Ring;
}

models::Tensors run_unit(const TrainConfig& train, int64_t index, const models::UnitCall& call,
                         const models::Tensors& inputs) {
  if (at::GradMode::is_enabled() &&
      parallel::checkpoint_block(train.activation_checkpointing, train.activation_checkpointing_every, index))
    return parallel::checkpointed_call(call, inputs);
  return call(inputs);
}

models::SublayerRunner sublayer_checkpointing(const TrainConfig& train) {
  if (train.activation_checkpointing != parallel::RecomputePolicy::attention &&
      train.activation_checkpointing != parallel::RecomputePolicy::mlp)
    return {};
  return [mode = train.activation_checkpointing, every = train.activation_checkpointing_every](
             int64_t index, models::Sublayer part, const models::UnitCall& call, const models::Tensors& inputs) {
    if (at::GradMode::is_enabled() && parallel::checkpoint_sublayer(mode, every, index, part))
      return parallel::checkpointed_call(call, inputs);
    return call(inputs);
  };
}

Parallelized parallelize_transformer(models::DiffusionModel& model, ParallelizeInputs inputs) {
  const Config& config = *inputs.config;
  Parallelized out;
  if (!inputs.runtime) {
    // One process: activation checkpointing only. Without it the blocks are called directly.
    if (config.train.activation_checkpointing == parallel::RecomputePolicy::full)
      model.unit_runner = [train = config.train](int64_t index, const models::UnitCall& call,
                                                 const models::Tensors& inputs) {
        return run_unit(train, index, call, inputs);
      };
    model.sublayer_runner = sublayer_checkpointing(config.train);
    return out;
  }
  parallel::Runtime& runtime = *inputs.runtime;

  // 1. Context parallelism: every block's attention spans the context group; this rank keeps its
  // tokens from the embedding on, and the output is gathered so unpatchify and the loss run whole
  // (and identically) on every context rank.
  if (config.parallel.cp > 1) {
    if (!inputs.context_attention)
      throw std::logic_error("parallelize_transformer: parallel.cp > 1 without the context attention kind");
    model.set_attention(parallel::context_attention(*inputs.context_attention, runtime, models::default_attention()));
    parallel::Comm& context = runtime.context_group();
    model.sequence_split = {[&context](const at::Tensor& t) { return parallel::split_sequence(t, context, 1); },
                            [&context](const at::Tensor& t) { return parallel::gather_sequence(t, context, 1); }};
  }

  // 2. FSDP over the model's units.
  parallel::Comm& shard = runtime.shard_group();
  parallel::Comm* replicate = runtime.replicate_group().size() > 1 ? &runtime.replicate_group() : nullptr;
  parallel::FsdpOptions options = fsdp_options(config);
  options.fp8_weights = std::move(inputs.fp8_weights);
  out.fsdp = std::make_unique<parallel::FullyShardedModule>(model, model.units(), shard, replicate, options);
  if (options.fault != parallel::ReductionFault::None)
    spdlog::warn("debug.inject.reduction is {}: gradients are reduced WRONGLY on purpose (a test of the checks)",
                 name_of(config.debug.reduction));

  // 3. Activation checkpointing inside FSDP's run_unit: a block's forward, and its recompute in
  // backward, run while the unit's weights are gathered.
  parallel::FullyShardedModule* fsdp = out.fsdp.get();
  model.unit_runner = [fsdp, train = config.train](int64_t index, const models::UnitCall& call,
                                                   const models::Tensors& inputs) {
    return fsdp->run_unit(index, inputs, [&] { return run_unit(train, index, call, inputs); });
  };
  model.sublayer_runner = sublayer_checkpointing(config.train);
  return out;
}

}  // namespace flowtrain::trainer
