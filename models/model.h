// The seam between a model family and everything else (trainer, FSDP, context parallelism, EMA,
// checkpoints, sampling, eval, bench): what a family's network is asked. A family's network
// (models/dit/, models/flux/) derives from DiffusionModel; its spec (trainer/family.h, in
// trainer/families/) builds it from the config and parallelises it, and nothing else names it.
//
// Distribution reaches a model only through the functions injected here — the attention
// kernel, how each unit runs (an FSDP gather around it, a recompute in backward) and how the
// token sequence is split over context-parallel ranks — so the model file reads like its paper.
#pragma once

#include "models/conditioning.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <functional>
#include <string>
#include <vector>

namespace flowtrain::models {

// The attention kernel a model calls: softmax(q·kᵀ/√Dh)·v on [B, H, N, Dh] tensors, no mask.
using AttentionFn =
    std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v)>;

using Tensors = std::vector<at::Tensor>;
// A unit's forward: its tensor inputs -> its tensor outputs (a DiT block: {x, c} -> {x}; a Flux
// double block returns the image and the text streams).
using UnitCall = std::function<Tensors(const Tensors& inputs)>;
// How the model runs block `index`. Empty = call it directly.
using UnitRunner = std::function<Tensors(int64_t index, const UnitCall& call, const Tensors& inputs)>;

// The two parts of a block that selective activation checkpointing recomputes on their own. What
// each covers is the block's business (each block's forward says); roughly: Attention = from
// the modulated input to the attention's projected output (q/k/v, norms, RoPE, the kernel and
// its communication); Mlp = from the modulated input to the MLP's output.
enum class Sublayer { Attention, Mlp };
// How a block runs one of its sublayers, bound to the block by the model. Empty = call it directly.
using SublayerFn = std::function<Tensors(Sublayer part, const UnitCall& call, const Tensors& inputs)>;
// The model-level hook behind it: the same with the block's index.
using SublayerRunner =
    std::function<Tensors(int64_t index, Sublayer part, const UnitCall& call, const Tensors& inputs)>;
// run(part, call, inputs), or call(inputs) when run is empty.
Tensors run_sublayer(const SublayerFn& run, Sublayer part, const UnitCall& call, const Tensors& inputs);

// How the token sequence is split across context-parallel ranks. Empty = the whole sequence is
// here. `split` keeps this rank's tokens of a [B, T, ·] tensor along dim 1 (tokens, position
// ids), `gather` reassembles the output before it leaves the model. Every per-token op between
// stays local; attention gets its keys and values from the other ranks through the AttentionFn.
struct SequenceSplit {
  std::function<at::Tensor(const at::Tensor& tokens)> split, gather;
};

// The model's units by module-name prefix, in execution order: what runs before the first block
// (embedders), one prefix per block, what runs after the last (final layer). FSDP shards and
// gathers by unit; every trainable parameter falls under exactly one prefix.
struct UnitPlan {
  std::vector<std::string> stem, blocks, head;
};

// Classifier-free guidance training: each entry of `probabilities` is one independent draw per
// sample (a class label: one; SD3-style text: one per encoder), and `apply` nulls, for every
// entry k, the samples where dropped[k] (bool [B]) is set.
struct ConditioningDropout {
  std::vector<double> probabilities;
  std::function<Conditioning(const Conditioning& cond, const std::vector<at::Tensor>& dropped)> apply;
};

class DiffusionModel : public torch::nn::Module {
 public:
  // The velocity v(x_t, t, cond): x [B, C, H, W], t [B] flow time in [0, 1] (models/flow_matching.h)
  // -> [B, C_out, H, W], C_out ≥ C (the objective uses the first C channels).
  virtual at::Tensor forward(const at::Tensor& x, const at::Tensor& t, const Conditioning& cond) = 0;

  // --- shape and cost --------------------------------------------------------------------------
  virtual std::vector<int64_t> sample_shape() const = 0;  // one sample: [C, H, W]
  virtual int64_t tokens_per_sample() const = 0;
  // How the token count comes about, for messages: "(model.image_size 28 / model.patch 4)²".
  virtual std::string token_layout() const = 0;
  // The streams context parallelism splits, each on its own (Flux: text, then image); they sum
  // to tokens_per_sample().
  virtual std::vector<int64_t> token_streams() const { return {tokens_per_sample()}; }
  virtual int64_t attention_heads() const = 0;
  // Training FLOPs per sample (3 × forward), from the layer shapes (docs/design/models.md, "FLOPs").
  virtual double train_flops_per_sample() const = 0;
  virtual std::string describe() const = 0;  // one line for the start-up log

  // --- conditioning ------------------------------------------------------------------------------
  virtual ConditioningDropout conditioning_dropout() const = 0;
  // What the unconditional branch of classifier-free guidance sees for `cond`'s rows.
  virtual Conditioning null_conditioning(const Conditioning& cond) const = 0;

  // --- what the runtime injects --------------------------------------------------------------------
  virtual UnitPlan units() const = 0;
  // Replaces every block's attention kernel (context parallelism).
  virtual void set_attention(const AttentionFn& attention) = 0;
  UnitRunner unit_runner;
  SublayerRunner sublayer_runner;  // selective activation checkpointing
  SequenceSplit sequence_split;
};

// What a model passes block `index`: sublayer_runner bound to the index (empty when it is).
SublayerFn sublayer_fn(const DiffusionModel& model, int64_t index);

// Every parameter, fixed ones (position tables) included.
int64_t count_parameters(const torch::nn::Module& module);

}  // namespace flowtrain::models
