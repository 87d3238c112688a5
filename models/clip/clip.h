// The CLIP text encoder (Radford et al.; transformers' modeling_clip.py,
// CLIPTextModel), FLUX.1's frozen pooled-text encoder (openai/clip-vit-large-patch14): its pooled
// output is the `vec` the transformer reads.
//
//   h = token_embedding(ids) + position_embedding(0 … L-1)
//   for each layer:  h += out_proj(causal attention(q, k, v of layer_norm1(h)))   scaled by 1/√d_head
//                    h += fc2(quick_gelu(fc1(layer_norm2(h))))                      quick_gelu = x·σ(1.702x)
//   hidden = final_layer_norm(h);  pooled = hidden at the end-of-text token
//
// The end-of-text position follows the reference's two rules: with a config's eos_token_id of 2
// (openai/clip-vit-large-patch14's, written before the fix) the position of each row's highest id
// (the end token 49407 is the largest); otherwise the first position holding eos_token_id.
// Keys are CLIPTextModel's as the released files hold them: `text_model.embeddings.token_embedding.weight`,
// `text_model.encoder.layers.N.self_attn.q_proj.weight`, `text_model.final_layer_norm.weight`.
#pragma once

#include "models/linear.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

namespace flowtrain::models {

struct ClipTextOptions {
  int64_t vocab_size = 49408;
  int64_t hidden = 768;
  int64_t intermediate = 3072;
  int64_t layers = 12;
  int64_t heads = 12;
  int64_t max_positions = 77;
  double layer_norm_eps = 1e-5;
  int64_t eos_token_id = 2;  // the config's value; 2 selects the highest-id rule (see above)
};

// openai/clip-vit-large-patch14's text model, FLUX.1's (123M parameters).
ClipTextOptions clip_l_text_options();
int64_t clip_text_parameter_count(const ClipTextOptions& o);

struct ClipAttentionImpl : torch::nn::Module {
  ClipAttentionImpl(int64_t hidden, int64_t heads);
  at::Tensor forward(const at::Tensor& x);  // causal over [B, L, D]
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};
  int64_t heads;
};
TORCH_MODULE(ClipAttention);

struct ClipMlpImpl : torch::nn::Module {
  ClipMlpImpl(int64_t hidden, int64_t intermediate);
  at::Tensor forward(const at::Tensor& x);
  Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(ClipMlp);

struct ClipEncoderLayerImpl : torch::nn::Module {
  explicit ClipEncoderLayerImpl(const ClipTextOptions& o);
  at::Tensor forward(const at::Tensor& x);
  ClipAttention self_attn{nullptr};
  torch::nn::LayerNorm layer_norm1{nullptr}, layer_norm2{nullptr};
  ClipMlp mlp{nullptr};
};
TORCH_MODULE(ClipEncoderLayer);

// `embeddings`: token_embedding, position_embedding.
struct ClipTextEmbeddingsImpl : torch::nn::Module {
  explicit ClipTextEmbeddingsImpl(const ClipTextOptions& o);
  torch::nn::Embedding token_embedding{nullptr}, position_embedding{nullptr};
};
TORCH_MODULE(ClipTextEmbeddings);

// `encoder`: layers.
struct ClipTextStackImpl : torch::nn::Module {
  explicit ClipTextStackImpl(const ClipTextOptions& o);
  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(ClipTextStack);

// `text_model`: embeddings, encoder, final_layer_norm.
struct ClipTextTransformerImpl : torch::nn::Module {
  explicit ClipTextTransformerImpl(const ClipTextOptions& o);
  ClipTextEmbeddings embeddings{nullptr};
  ClipTextStack encoder{nullptr};
  torch::nn::LayerNorm final_layer_norm{nullptr};
};
TORCH_MODULE(ClipTextTransformer);

struct ClipTextOutput {
  at::Tensor hidden;  // [B, L, D] after the final LayerNorm
  at::Tensor pooled;  // [B, D] at each row's end-of-text token
};

struct ClipTextEncoderImpl : torch::nn::Module {
  explicit ClipTextEncoderImpl(ClipTextOptions o);
  ClipTextOutput forward(const at::Tensor& ids);  // ids [B, L] int64, L <= max_positions
  ClipTextTransformer text_model{nullptr};
  ClipTextOptions options;
};
TORCH_MODULE(ClipTextEncoder);

}  // namespace flowtrain::models
