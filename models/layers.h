// Building blocks shared by the diffusion transformers, written as in the papers.
//
// Conventions: tokens are [B, N, D] (batch, sequence, hidden); attention heads [B, H, N, Dh].
// Parameter names equal the reference checkpoints' (facebookresearch/DiT models.py, which uses
// timm's Attention/Mlp/PatchEmbed), so their weights load and our exports load into their code.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <functional>

namespace flowtrain::models {

// The attention kernel a model calls: softmax(q·kᵀ/√Dh)·v on [B, H, N, Dh] tensors, no mask.
// Injected so that context parallelism (Ulysses, ring) can replace it without the model knowing.
using AttentionFn =
    std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v)>;
AttentionFn default_attention();  // at::scaled_dot_product_attention

// Every linear layer of a model is created here, so that one setting (fp8 training, a later
// issue) can switch the implementation of all of them in one place.
torch::nn::Linear make_linear(int64_t in_features, int64_t out_features, bool bias = true);

// x·(1 + scale) + shift, with per-sample shift/scale [B, D] broadcast over tokens [B, N, D].
at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale);

// LayerNorm without affine parameters, eps 1e-6 (DiT's norm1/norm2/norm_final).
at::Tensor layer_norm_no_affine(const at::Tensor& x);

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
  at::Tensor forward(const at::Tensor& x);  // [B, C, H, W] -> [B, (H/p)·(W/p), D]
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
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  int64_t heads;
  AttentionFn attention;
};
TORCH_MODULE(Attention);

// D -> mlp_ratio·D -> GELU(tanh) -> D. Keys: mlp.fc1.*, mlp.fc2.*
struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t hidden, int64_t mlp_hidden);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

}  // namespace flowtrain::models
