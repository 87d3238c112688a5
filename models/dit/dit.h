// DiT: Scalable Diffusion Models with Transformers (Peebles & Xie, 2023), as in
// facebookresearch/DiT models.py, trained here with flow matching (models/flow_matching.h).
//
//   x [B, C, H, W] ─ x_embedder (patchify) ─ + pos_embed ─▶ tokens [B, T, D]
//   t [B] ─ t_embedder ─┐
//   y [B] ─ y_embedder ─┴─ c = t_emb + y_emb [B, D]
//   tokens ─ blocks[0..depth) (adaLN-Zero, conditioned on c) ─ final_layer ─ unpatchify ─▶ [B, C_out, H, W]
//
// Parameter names and shapes equal the reference checkpoints (x_embedder.proj.weight,
// blocks.0.adaLN_modulation.1.weight, final_layer.linear.weight, …).
#pragma once

#include "models/layers.h"

#include <torch/nn/modules/container/modulelist.h>

#include <string>

namespace flowtrain::models {

struct DiTOptions {
  int64_t input_size = 32;    // H = W of the input (pixels or latent cells)
  int64_t patch = 2;
  int64_t in_channels = 4;
  int64_t hidden = 1152;
  int64_t depth = 28;
  int64_t heads = 16;
  double mlp_ratio = 4.0;
  int64_t num_classes = 1000;
  bool learn_sigma = true;    // output 2·C channels (reference DiT); flow matching uses the first C
  // Flow time t ∈ [0, 1] is multiplied by this before the sinusoidal embedding, so the
  // embedding's frequencies (periods 2π … 2π·10⁴) see a useful range (Flux convention: 1000).
  double timestep_scale = 1000.0;

  int64_t out_channels() const { return learn_sigma ? 2 * in_channels : in_channels; }
  int64_t grid() const { return input_size / patch; }
  int64_t num_tokens() const { return grid() * grid(); }
  int64_t mlp_hidden() const { return static_cast<int64_t>(hidden * mlp_ratio); }
};

// Named reference sizes: "S", "B", "L", "XL" (DiT paper, Table 1) and "tiny" (tests, CPU demo).
// Sets depth/hidden/heads on a copy of `base`. Throws std::invalid_argument for other names.
DiTOptions dit_size(const std::string& name, DiTOptions base = {});
std::vector<std::string> dit_size_names();  // tiny, S, B, L, XL

// One DiT block with adaLN-Zero conditioning.
struct DiTBlockImpl : torch::nn::Module {
  DiTBlockImpl(int64_t hidden, int64_t heads, int64_t mlp_hidden, AttentionFn attention);
  // [B, T, D], [B, D]. `sublayer` runs the attention branch (adaLN-modulated input to the
  // attention's projected output) and the MLP branch (modulated input to the MLP's output).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& c, const SublayerFn& sublayer = {});
  Attention attn{nullptr};
  Mlp mlp{nullptr};
  torch::nn::Sequential adaLN_modulation{nullptr};  // [SiLU, Linear(D, 6D)]
};
TORCH_MODULE(DiTBlock);

// Final adaLN (shift, scale) + Linear(D, p²·C_out).
struct FinalLayerImpl : torch::nn::Module {
  FinalLayerImpl(int64_t hidden, int64_t patch, int64_t out_channels);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& c);  // -> [B, T, p²·C_out]
  Linear linear{nullptr};
  torch::nn::Sequential adaLN_modulation{nullptr};  // [SiLU, Linear(D, 2D)]
};
TORCH_MODULE(FinalLayer);

struct DiTImpl : DiffusionModel {
  explicit DiTImpl(const DiTOptions& options, AttentionFn attention = default_attention());

  // x [B, C, H, W], t [B] flow time in [0, 1], y [B] labels (num_classes = null class)
  // -> [B, C_out, H, W]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& t, const at::Tensor& y);
  // The same with y = cond["labels"].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& t, const Conditioning& cond) override;

  // [B, T, p²·C] -> [B, C, H, W]; each token's features are ordered (p, q, c) (row, col, channel).
  at::Tensor unpatchify(const at::Tensor& tokens) const;

  // The reference initialisation (DiT.initialize_weights), drawn from the global CPU generator.
  void initialize_weights();

  // DiffusionModel
  std::vector<int64_t> sample_shape() const override;
  int64_t tokens_per_sample() const override { return options.num_tokens(); }
  std::string token_layout() const override;
  int64_t attention_heads() const override { return options.heads; }
  double train_flops_per_sample() const override;
  std::string describe() const override;
  // One draw per sample: the label becomes the null class (row num_classes) with probability
  // class_dropout.
  ConditioningDropout conditioning_dropout() const override;
  Conditioning null_conditioning(const Conditioning& cond) const override;  // every label null
  UnitPlan units() const override;  // stem: the embedders; a unit per block; head: final_layer
  void set_attention(const AttentionFn& attention) override;

  DiTOptions options;
  double class_dropout = 0.1;  // probability a training label is replaced by the null class
  PatchEmbed x_embedder{nullptr};
  TimestepEmbedder t_embedder{nullptr};
  LabelEmbedder y_embedder{nullptr};
  at::Tensor pos_embed;  // [1, T, D], a fixed (requires_grad = false) parameter, as the reference
  torch::nn::ModuleList blocks{nullptr};
  FinalLayer final_layer{nullptr};
};
TORCH_MODULE(DiT);

// Training FLOPs per sample (3 × forward) from the layer shapes: linears 2·in·out per token,
// attention 4·T·D per token per block (q·kᵀ and p·v), adaLN per sample. See docs/design/models.md, "FLOPs".
double dit_forward_flops_per_sample(const DiTOptions& o);
inline double dit_train_flops_per_sample(const DiTOptions& o) { return 3.0 * dit_forward_flops_per_sample(o); }
// Each FSDP unit's parameters and what its training forward keeps (models/footprint.h), in the
// order of units(): stem, blocks, head. `cpu_fp32`: the run computes fp32 on the CPU, where
// short sequences take the fused qkv attention or the math path (both keep the probabilities).
std::vector<UnitFootprint> dit_unit_footprints(const DiTOptions& o, bool cpu_fp32);

}  // namespace flowtrain::models
