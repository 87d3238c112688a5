// Building blocks shared by the diffusion transformers, written as in the papers.
//
// Conventions: tokens are [B, N, D] (batch, sequence, hidden); attention heads [B, H, N, Dh].
// Parameter names equal the reference checkpoints' (facebookresearch/DiT models.py, which uses
// timm's Attention/Mlp/PatchEmbed), so their weights load and our exports load into their code.
#pragma once

#include "models/footprint.h"
#include "models/linear.h"
#include "models/model.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/pimpl.h>

#include <functional>

namespace flowtrain::models {

// AttentionFn (models/model.h) is injected so that context parallelism (Ulysses, ring) can
// replace the kernel without the model knowing. The default:
// at::scaled_dot_product_attention, except for short fp32 sequences on the CPU: there ATen's
// CPU flash kernel loses to the plain composition (batched GEMMs + softmax) by 1.1–3× for
// N ≤ 144 tokens (fwd+bwd, 2 threads; docs/perf.md), so N ≤ kMathAttentionMaxTokens takes
// math_attention. (The DiT Attention module goes one step further on that path: with the
// default attention it runs cpu_fused::qkv_attention on the qkv output, skipping the transposes.)
AttentionFn default_attention();
bool is_default_attention(const AttentionFn& fn);
constexpr int64_t kMathAttentionMaxTokens = 128;
// What the default attention keeps for backward over `tokens` tokens (models/footprint.h): the
// probabilities on the math path (fp32 CPU tensors, tokens ≤ kMathAttentionMaxTokens), else SDPA's
// output and log-sum-exp.
AttentionSaves default_attention_saves(bool cpu_fp32, int64_t tokens);
// softmax((q/√Dh)·kᵀ)·v with explicit GEMMs (keeps the [B, H, N, N] probabilities for backward).
at::Tensor math_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// xavier_uniform on every Linear's weight (models/linear.h) and zero biases, in module order (the
// DiT reference's _basic_init; Flux's from-scratch initialisation starts the same way). Draws
// from the global CPU generator.
void xavier_init_linears(torch::nn::Module& model);

// GELU, tanh approximation (as at::gelu(x, "tanh")): the fused CPU kernel for fp32 CPU tensors
// when the CPU has AVX2+FMA (models/kernels/cpu_fused.h), else ATen.
at::Tensor gelu_tanh(const at::Tensor& x);

// x·(1 + scale) + shift, with per-sample shift/scale [B, D] broadcast over tokens [B, N, D].
at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale);

// LayerNorm without affine parameters, eps 1e-6 (DiT's norm1/norm2/norm_final).
at::Tensor layer_norm_no_affine(const at::Tensor& x);

// adaLN: modulate(layer_norm_no_affine(x), shift, scale), x [B, N, D], shift/scale [B, D].
// fp32 on the CPU: one fused kernel each way (per token: moments, normalise, modulate; backward:
// the LayerNorm gradient with the per-sample gain 1 + scale, and the shift/scale gradients
// reduced over tokens in the same pass), saving only x and the per-token mean and 1/σ. CUDA:
// the fused kernel of models/kernels/cuda/ (one pass each way, fp32 math, bf16 or fp32 tensors).
// Elsewhere: the same two ATen ops as the composition.
at::Tensor adaln_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale);

// The gated residual of a DiT block, x + gate·y, with a per-sample gate [B, D] broadcast over
// tokens [B, N, D]. fp32 on the CPU: one pass forward; backward ∂y = g·gate and ∂gate = Σ_tokens
// g·y in one pass (∂x = g). CUDA with x and y of one dtype: the fused kernel
// (models/kernels/cuda/). Elsewhere at::addcmul.
at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y);

// Fixed 2-D sin-cos position table [grid·grid, dim] (float64 math, returned as float32).
// First dim/2 channels encode the column (w) coordinate, last dim/2 the row (h); each half is
// [sin(pos·ω), cos(pos·ω)] with ω_k = 10000^(−k/(dim/4)), k = 0…dim/4−1 (DiT/MAE convention).
at::Tensor sincos_pos_embed_2d(int64_t dim, int64_t grid);

// Sinusoidal timestep features [B, dim]: cat[cos(t·f), sin(t·f)], f_k = exp(−ln(max_period)·k/(dim/2)).
// (DiT's TimestepEmbedder.timestep_embedding; t may be fractional.)
at::Tensor timestep_features(const at::Tensor& t, int64_t dim, double max_period = 10000.0);

// Conv2d(C, D, kernel = stride = p) then flatten to row-major tokens. Key: x_embedder.proj.*
struct PatchEmbedImpl : torch::nn::Module {
  PatchEmbedImpl(int64_t in_channels, int64_t hidden, int64_t patch);
  // [B, C, H, W] -> [B, (H/p)·(W/p), D], contiguous (token-major): every later elementwise op
  // keeps its input's layout, so a transposed view here would make each LayerNorm and linear of
  // every block copy its input (and its gradient) to contiguous memory, fwd and bwd.
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Conv2d proj{nullptr};
};
TORCH_MODULE(PatchEmbed);

// t -> 256 sinusoidal features -> Linear -> SiLU -> Linear. Keys: t_embedder.mlp.{0,2}.*
struct TimestepEmbedderImpl : torch::nn::Module {
  explicit TimestepEmbedderImpl(int64_t hidden, int64_t frequency_dim = 256);
  at::Tensor forward(const at::Tensor& t);  // [B] -> [B, D]
  torch::nn::Sequential mlp{nullptr};
  int64_t frequency_dim;
};
TORCH_MODULE(TimestepEmbedder);

// Class label -> vector; row `num_classes` is the null class used for classifier-free guidance.
// Key: y_embedder.embedding_table.weight [num_classes + 1, D]. Label dropout is done by the
// objective (it replaces labels by the null class), so this module is deterministic.
struct LabelEmbedderImpl : torch::nn::Module {
  LabelEmbedderImpl(int64_t num_classes, int64_t hidden);
  at::Tensor forward(const at::Tensor& labels);  // [B] int64 -> [B, D]
  torch::nn::Embedding embedding_table{nullptr};
  int64_t num_classes;
};
TORCH_MODULE(LabelEmbedder);

// Multi-head self-attention with a fused qkv projection (bias on). Keys: attn.qkv.*, attn.proj.*
struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int64_t hidden, int64_t heads, AttentionFn attention);
  at::Tensor forward(const at::Tensor& x);  // [B, N, D] -> [B, N, D]
  Linear qkv{nullptr}, proj{nullptr};
  int64_t heads;
  AttentionFn attention;
};
TORCH_MODULE(Attention);

// D -> mlp_ratio·D -> GELU(tanh) -> D. Keys: mlp.fc1.*, mlp.fc2.*
struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t hidden, int64_t mlp_hidden);
  at::Tensor forward(const at::Tensor& x);
  Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

}  // namespace flowtrain::models
