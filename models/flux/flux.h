// FLUX.1: the multimodal diffusion transformer of black-forest-labs/flux (src/flux/model.py,
// modules/layers.py, math.py), text-conditioned, trained here with flow matching.
//
//   x [B, C, H, W] ─ pack 2×2 ─ img_in ─▶ img [B, L_img, D]        ids (0, row, col)
//   (video: x [B, C, T, H, W] ─ pack pt×p×p ─ img_in ─▶ [B, T/pt·H/p·W/p, D]   ids (t, row, col),
//    as HunyuanVideo: the same blocks over 3-D ids; T = 1 is the image model bit for bit)
//   cond.txt [B, L_txt, D_ctx] ─ txt_in ─▶ txt [B, L_txt, D]        ids (0, 0, 0)
//   vec = time_in(temb(1000·t)) [+ guidance_in(temb(1000·g))] + vector_in(cond.vec)
//   pe = RoPE(cat(txt_ids, img_ids)) on interleaved pairs, axes_dim split of the head dim
//   double_blocks[0..depth): per stream modulation (6 chunks), LN, qkv, QK-RMSNorm; joint attention
//                            over [txt, img]; proj + gated residual; GELU-tanh MLP + gated residual
//   single_blocks[0..depth_single) on cat(txt, img): linear1 = qkv ‖ mlp, joint attention,
//                            linear2(cat(attn, gelu(mlp))), gated residual (3 chunks)
//   final_layer on the image tokens (shift, scale) ─ unpack ─▶ [B, C, H, W]
//
// Parameter names and shapes are the reference checkpoints' (`double_blocks.0.img_attn.qkv.weight`,
// `double_blocks.0.txt_attn.norm.key_norm.scale`, `single_blocks.3.linear1.weight`, …), so
// official weights load and exports load into the reference code.
#pragma once

#include "models/layers.h"
#include "models/model.h"

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <string>
#include <vector>

namespace flowtrain::models {

struct FluxOptions {
  int64_t in_channels = 16;   // latent channels C
  int64_t patch = 2;          // 2×2 packing: C·p² = 64 features per image token
  int64_t input_size = 64;    // latent side (H = W)
  int64_t frames = 1;         // latent frames T: 1 = images [B, C, H, W]; > 1 = clips [B, C, T, H, W]
  int64_t patch_t = 1;        // frames per token (HunyuanVideo, Wan: 1); divides frames
  int64_t hidden = 3072;
  int64_t heads = 24;
  int64_t depth = 19;         // double-stream blocks
  int64_t depth_single = 38;  // single-stream blocks
  double mlp_ratio = 4.0;
  int64_t context_dim = 4096;  // text token embedding width (T5-XXL)
  int64_t vec_dim = 768;       // pooled text vector width (CLIP-L)
  std::vector<int64_t> axes_dim = {16, 56, 56};  // RoPE channels per id axis; sums to the head dim
  double theta = 10000.0;
  bool qkv_bias = true;
  bool guidance_embed = false;  // flux-dev: a distilled-guidance embedder (guidance_in)
  int64_t text_len = 512;       // text tokens per sample (counts and FLOPs; batches carry their own)
  double time_factor = 1000.0;  // t ∈ [0, 1] is multiplied by this before the sinusoidal features

  int64_t token_dim() const { return in_channels * patch_t * patch * patch; }
  int64_t grid() const { return input_size / patch; }
  int64_t grid_t() const { return frames / patch_t; }
  bool is_video() const { return frames > 1; }
  // Tokens of the visual stream (every frame's): the "image" stream of the reference's names.
  int64_t image_tokens() const { return grid_t() * grid() * grid(); }
  int64_t head_dim() const { return hidden / heads; }
  int64_t mlp_hidden() const { return static_cast<int64_t>(hidden * mlp_ratio); }
};

// Named sizes: "flux-dev" (19 + 38 blocks, 3072, 24 heads, guidance embedding), "flux-schnell"
// (the same without guidance), and small ones for the CPU: "flux-tiny" (tests), "flux-small".
// Sets the architecture fields on a copy of `base`; throws std::invalid_argument for other names.
FluxOptions flux_size(const std::string& name, FluxOptions base = {});
std::vector<std::string> flux_size_names();

// From the layer shapes, without building the model (flux-dev has 11.9B parameters).
int64_t flux_parameter_count(const FluxOptions& o);
// Each FSDP unit's parameters and what its training forward keeps (models/footprint.h), in the
// order of units(): stem, double blocks, single blocks, head. `attention`: what the blocks'
// attention kernel keeps (default_attention_saves for the joint sequence).
std::vector<UnitFootprint> flux_unit_footprints(const FluxOptions& o, AttentionSaves attention);
// Forward FLOPs per sample: linears 2·in·out per token of their stream, attention 4·T·D per token
// per block over the joint sequence (T = image + text tokens), modulations once per sample.
double flux_forward_flops_per_sample(const FluxOptions& o);

// "b c (h ph) (w pw) -> b (h w) (c ph pw)" and its inverse.
at::Tensor pack_latents(const at::Tensor& x, int64_t patch);
at::Tensor unpack_latents(const at::Tensor& tokens, int64_t channels, int64_t patch, int64_t grid_h, int64_t grid_w);
// Video: "b c (t pt) (h ph) (w pw) -> b (t h w) (c pt ph pw)" (frame-major tokens; a token's
// values in the order of a Conv3d patch embedding's weight [D, C, pt, ph, pw]) and its inverse.
at::Tensor pack_video_latents(const at::Tensor& x, int64_t patch_t, int64_t patch);
at::Tensor unpack_video_latents(const at::Tensor& tokens, int64_t channels, int64_t patch_t, int64_t patch,
                                int64_t grid_t, int64_t grid_h, int64_t grid_w);
// Image ids [B, h·w, 3]: (0, row, col) per token, row-major, float.
at::Tensor image_ids(int64_t batch, int64_t grid_h, int64_t grid_w, const at::TensorOptions& options);
// Video ids [B, t·h·w, 3]: (frame, row, col) per token in pack_video_latents' order; t = 1 gives image_ids.
at::Tensor video_ids(int64_t batch, int64_t grid_t, int64_t grid_h, int64_t grid_w, const at::TensorOptions& options);

// x · rsqrt(mean(x²) + 1e-6) in (at least) fp32, back to the input's dtype, times the learnable `scale`.
struct RmsNormImpl : torch::nn::Module {
  explicit RmsNormImpl(int64_t dim);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor scale;
};
TORCH_MODULE(RmsNorm);

// Keys: norm.query_norm.scale, norm.key_norm.scale [head_dim].
struct QkNormImpl : torch::nn::Module {
  explicit QkNormImpl(int64_t head_dim);
  // Both returned in v's dtype, as the reference.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);
  RmsNorm query_norm{nullptr}, key_norm{nullptr};
};
TORCH_MODULE(QkNorm);

// in_layer → SiLU → out_layer. Keys: time_in.in_layer.*, vector_in.out_layer.*
struct MlpEmbedderImpl : torch::nn::Module {
  MlpEmbedderImpl(int64_t in_dim, int64_t hidden);
  at::Tensor forward(const at::Tensor& x);
  Linear in_layer{nullptr}, out_layer{nullptr};
};
TORCH_MODULE(MlpEmbedder);

// lin(silu(vec)) in `chunks` pieces of [B, D]: 6 for a double-stream block (shift, scale, gate of
// the attention branch, then of the MLP branch), 3 for a single-stream block. Key: *.lin.*
struct ModulationImpl : torch::nn::Module {
  ModulationImpl(int64_t hidden, int64_t chunks);
  std::vector<at::Tensor> forward(const at::Tensor& vec);
  Linear lin{nullptr};
  int64_t chunks;
};
TORCH_MODULE(Modulation);

// A stream's qkv projection, QK norm and output projection. Keys: *_attn.qkv, *_attn.norm.*, *_attn.proj
struct FluxSelfAttentionImpl : torch::nn::Module {
  FluxSelfAttentionImpl(int64_t hidden, int64_t heads, bool qkv_bias);
  // x [B, L, D] -> q, k, v [B, H, L, Dh] with q and k normalised.
  std::vector<at::Tensor> project_qkv(const at::Tensor& x);
  Linear qkv{nullptr}, proj{nullptr};
  QkNorm norm{nullptr};
  int64_t heads;
};
TORCH_MODULE(FluxSelfAttention);

// Attention over the joint sequence with RoPE: q, k, v [B, H, L, Dh], angles [B, L, Dh/2, 2]
// -> [B, L, H·Dh].
at::Tensor rope_attention(const AttentionFn& attention, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& angles);

struct DoubleStreamBlockImpl : torch::nn::Module {
  DoubleStreamBlockImpl(int64_t hidden, int64_t heads, int64_t mlp_hidden, bool qkv_bias, AttentionFn attention);
  // img [B, Li, D], txt [B, Lt, D], vec [B, D], angles [B, Lt + Li, Dh/2, 2] -> {img, txt}.
  // `sublayer` runs the joint attention (both streams' modulated inputs to their projected
  // attention outputs) and each stream's MLP (modulated input to MLP output).
  Tensors forward(const at::Tensor& img, const at::Tensor& txt, const at::Tensor& vec, const at::Tensor& angles,
                  const SublayerFn& sublayer = {});
  Modulation img_mod{nullptr}, txt_mod{nullptr};
  FluxSelfAttention img_attn{nullptr}, txt_attn{nullptr};
  torch::nn::Sequential img_mlp{nullptr}, txt_mlp{nullptr};  // [Linear, GELU(tanh), Linear]
  AttentionFn attention;
};
TORCH_MODULE(DoubleStreamBlock);

struct SingleStreamBlockImpl : torch::nn::Module {
  SingleStreamBlockImpl(int64_t hidden, int64_t heads, int64_t mlp_hidden, AttentionFn attention);
  // x [B, L, D] (text then image tokens), vec [B, D], angles [B, L, Dh/2, 2] -> x.
  // `sublayer` runs the attention (linear1's q/k/v part to the attention output) and the MLP —
  // here the GELU and linear2, which mixes attention and MLP features, so it goes with the MLP.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& vec, const at::Tensor& angles,
                     const SublayerFn& sublayer = {});
  Linear linear1{nullptr}, linear2{nullptr};  // D -> 3D + M; D + M -> D
  QkNorm norm{nullptr};
  Modulation modulation{nullptr};
  int64_t heads, mlp_hidden;
  AttentionFn attention;
};
TORCH_MODULE(SingleStreamBlock);

// adaLN (shift, scale) then Linear(D, p²·C). Keys: final_layer.linear.*, final_layer.adaLN_modulation.1.*
struct FluxFinalLayerImpl : torch::nn::Module {
  FluxFinalLayerImpl(int64_t hidden, int64_t out_features);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& vec);
  Linear linear{nullptr};
  torch::nn::Sequential adaLN_modulation{nullptr};  // [SiLU, Linear(D, 2D)]
};
TORCH_MODULE(FluxFinalLayer);

struct FluxImpl : DiffusionModel {
  explicit FluxImpl(const FluxOptions& options, AttentionFn attention = default_attention());

  // x [B, C, H, W] latents (or clips [B, C, T, H, W]), t [B], cond {"txt" [B, L, context_dim],
  // "vec" [B, vec_dim], "guidance" [B] optional} -> velocity of x's shape.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& t, const Conditioning& cond) override;
  // The reference's forward on packed tokens: img [B, Li, C·p²], img_ids [B, Li, 3], txt [B, Lt,
  // context_dim], txt_ids [B, Lt, 3], timesteps [B], y [B, vec_dim], guidance [B] (or undefined)
  // -> [B, Li, C·p²].
  at::Tensor forward_tokens(const at::Tensor& img, const at::Tensor& img_ids, const at::Tensor& txt,
                            const at::Tensor& txt_ids, const at::Tensor& timesteps, const at::Tensor& y,
                            const at::Tensor& guidance);

  // Training from scratch: xavier-uniform linears with zero biases, embedders N(0, 0.02), and
  // every modulation and the final layer zero, so each block starts as the identity and the
  // model outputs 0 (adaLN-Zero, as DiT). Drawn from the global CPU generator.
  void initialize_weights();

  // DiffusionModel
  std::vector<int64_t> sample_shape() const override;
  int64_t tokens_per_sample() const override { return options.image_tokens() + options.text_len; }
  std::string token_layout() const override;
  std::vector<int64_t> token_streams() const override { return {options.text_len, options.image_tokens()}; }
  int64_t attention_heads() const override { return options.heads; }
  double train_flops_per_sample() const override { return 3.0 * flux_forward_flops_per_sample(options); }
  std::string describe() const override;
  // SD3-style: "txt" and "vec" each replaced by zeros with probability text_dropout, independently.
  ConditioningDropout conditioning_dropout() const override;
  Conditioning null_conditioning(const Conditioning& cond) const override;  // zero text, same guidance
  UnitPlan units() const override;  // stem: the embedders; double then single blocks; head: final_layer
  void set_attention(const AttentionFn& attention) override;

  // guidance_embed: the g fed to guidance_in, [B] — the conditioning's "guidance" when it has one,
  // else `guidance` for every row (a guidance-distilled model is fine-tuned and sampled at one g).
  at::Tensor guidance_input(const Conditioning& cond, int64_t batch, const at::TensorOptions& options) const;

  FluxOptions options;
  double text_dropout = 0.1;
  // FLUX.1-dev's distilled guidance when the conditioning carries none: 3.5, the default of
  // diffusers' and kohya's FLUX.1-dev fine-tuning scripts (some trainers use 1.0).
  double guidance = 3.5;
  Linear img_in{nullptr}, txt_in{nullptr};
  MlpEmbedder time_in{nullptr}, vector_in{nullptr}, guidance_in{nullptr};
  torch::nn::ModuleList double_blocks{nullptr}, single_blocks{nullptr};
  FluxFinalLayer final_layer{nullptr};
};
TORCH_MODULE(Flux);

}  // namespace flowtrain::models
