// A small text encoder trained jointly with the image model: the built-in stand-in for T5 (token
// embeddings) and CLIP (a pooled vector), so captions train without downloaded weights.
//
//   tokens [B, L] ─ token_embedding + position_embedding ─▶ layers (pre-LN: x += attn(LN(x)) with
//   padding keys masked; x += MLP(LN(x)), GELU-tanh) ─ final_norm ─▶ txt [B, L, width]
//   vec = pooled_proj(mean of txt over the real tokens) [B, pooled_dim]
//
// Padding positions of txt are zero, and a row without any token (the empty prompt, or a caption
// dropped for classifier-free guidance) gives txt = 0 and vec = 0: SD3's unconditional input.
#pragma once

#include "models/linear.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>

namespace flowtrain::models {

struct TextEncoderOptions {
  int64_t vocab_size = 256;
  int64_t length = 32;  // positions (model.text_len)
  int64_t width = 128;  // = the transformer's context_dim
  int64_t depth = 2;
  int64_t heads = 4;
  double mlp_ratio = 4.0;
  int64_t pooled_dim = 128;  // = the transformer's vec_dim
};

struct TextEncoderLayerImpl : torch::nn::Module {
  TextEncoderLayerImpl(int64_t width, int64_t heads, int64_t mlp_hidden);
  // x [B, L, W], attend bool [B, 1, 1, L] (true: key may be attended) -> [B, L, W]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& attend);
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};
  int64_t heads;
};
TORCH_MODULE(TextEncoderLayer);

struct TextEncoderImpl : torch::nn::Module {
  explicit TextEncoderImpl(const TextEncoderOptions& options);
  struct Output {
    at::Tensor txt;  // [B, L, width]
    at::Tensor vec;  // [B, pooled_dim]
  };
  // tokens int64 [B, L] (L <= options.length), mask bool [B, L] (true on real tokens).
  Output forward(const at::Tensor& tokens, const at::Tensor& mask);

  TextEncoderOptions options;
  torch::nn::Embedding token_embedding{nullptr};
  at::Tensor position_embedding;  // [length, width], learned
  torch::nn::ModuleList layers{nullptr};
  torch::nn::LayerNorm final_norm{nullptr};
  Linear pooled_proj{nullptr};
};
TORCH_MODULE(TextEncoder);

int64_t text_encoder_parameter_count(const TextEncoderOptions& o);
double text_encoder_forward_flops_per_sample(const TextEncoderOptions& o);
// Elements its training forward keeps for backward per sample (models/footprint.h): per layer
// and token the input and the first LayerNorm's output (2), qkv (3), SDPA's output and its
// [L, W] copy (2), the residual stream and the second LayerNorm's output (2), the GELU's input
// and output (2·M/W); then the final norm's input and output.
double text_encoder_saved_per_sample(const TextEncoderOptions& o);

}  // namespace flowtrain::models
