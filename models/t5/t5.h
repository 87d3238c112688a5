// The T5 v1.1 encoder (Raffel et al.; Hugging Face transformers' modeling_t5.py,
// T5EncoderModel), FLUX.1's frozen text encoder (google/t5-v1_1-xxl): its last hidden state is
// the `txt` the transformer reads.
//
//   h = shared(ids)                                          token embedding, not scaled
//   for each block:  h += o(attention(q, k, v of rms(h)) + bias)   no 1/√d scaling; the relative
//                                                                   position bias of block 0 in every block
//                    h += wo(gelu_tanh(wi_0 rms(h)) · wi_1 rms(h))   gated-GELU feed-forward
//   out = final_layer_norm(h)
//
//   rms(x) = weight · x / sqrt(mean(x²) + 1e-6), in fp32 (T5LayerNorm: no mean, no bias)
//   bias[h, i, j] = relative_attention_bias[bucket(j − i), h]: 32 buckets, half per direction,
//                   exact below 8, log-spaced up to 128, the rest in the last
//
// Keys are T5EncoderModel's: `shared.weight`, `encoder.block.0.layer.0.SelfAttention.q.weight`,
// `encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight`,
// `encoder.block.N.layer.1.DenseReluDense.wi_0.weight`, `encoder.final_layer_norm.weight`.
#pragma once

#include "models/linear.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/pimpl.h>

#include <optional>

namespace flowtrain::models {

// T5EncoderModel ties encoder.embed_tokens to shared: a file may hold the tensor under both
// names (save_pretrained writes shared.weight only). Pass to trainer::load_weights_file as `tied`.
inline const char* const kT5TiedEmbedding = "encoder.embed_tokens.weight";

struct T5Options {
  int64_t vocab_size = 32128;
  int64_t d_model = 4096;
  int64_t d_kv = 64;  // per head
  int64_t d_ff = 10240;
  int64_t num_layers = 24;
  int64_t num_heads = 64;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  double layer_norm_eps = 1e-6;
};

// google/t5-v1_1-xxl, FLUX.1's (4.76B parameters in the encoder).
T5Options t5_xxl_options();
int64_t t5_encoder_parameter_count(const T5Options& o);

// The bucket of each relative position (key − query) of a bidirectional encoder, int64.
at::Tensor t5_relative_position_bucket(const at::Tensor& relative_position, int64_t num_buckets, int64_t max_distance);

struct T5LayerNormImpl : torch::nn::Module {
  T5LayerNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  double eps;
};
TORCH_MODULE(T5LayerNorm);

struct T5AttentionImpl : torch::nn::Module {
  T5AttentionImpl(const T5Options& o, bool has_relative_attention_bias);
  // x [B, L, D], bias [1, H, L, L] (+ the mask's −∞ where a key is padding) -> [B, L, D]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& bias);
  // The position bias [1, H, L, L] from relative_attention_bias (block 0's).
  at::Tensor position_bias(int64_t length);
  Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
  torch::nn::Embedding relative_attention_bias{nullptr};  // block 0 only
  T5Options options;
};
TORCH_MODULE(T5Attention);

// layer.0: layer_norm + SelfAttention.
struct T5LayerSelfAttentionImpl : torch::nn::Module {
  T5LayerSelfAttentionImpl(const T5Options& o, bool has_relative_attention_bias);
  T5Attention SelfAttention{nullptr};
  T5LayerNorm layer_norm{nullptr};
};
TORCH_MODULE(T5LayerSelfAttention);

// layer.1: layer_norm + DenseReluDense (wi_0, wi_1, wo; gated GELU despite the name).
struct T5DenseGatedGeluImpl : torch::nn::Module {
  explicit T5DenseGatedGeluImpl(const T5Options& o);
  at::Tensor forward(const at::Tensor& x);
  Linear wi_0{nullptr}, wi_1{nullptr}, wo{nullptr};
};
TORCH_MODULE(T5DenseGatedGelu);

struct T5LayerFFImpl : torch::nn::Module {
  explicit T5LayerFFImpl(const T5Options& o);
  T5DenseGatedGelu DenseReluDense{nullptr};
  T5LayerNorm layer_norm{nullptr};
};
TORCH_MODULE(T5LayerFF);

struct T5BlockImpl : torch::nn::Module {
  T5BlockImpl(const T5Options& o, bool has_relative_attention_bias);
  at::Tensor forward(const at::Tensor& h, const at::Tensor& bias);
  torch::nn::ModuleList layer{nullptr};  // [T5LayerSelfAttention, T5LayerFF]
};
TORCH_MODULE(T5Block);

struct T5StackImpl : torch::nn::Module {
  explicit T5StackImpl(const T5Options& o);
  torch::nn::ModuleList block{nullptr};
  T5LayerNorm final_layer_norm{nullptr};
};
TORCH_MODULE(T5Stack);

struct T5EncoderImpl : torch::nn::Module {
  explicit T5EncoderImpl(T5Options o);
  // ids [B, L] int64 -> last hidden state [B, L, d_model]. `mask` [B, L] bool (true = a token)
  // keeps padding out of every attention; FLUX's conditioner passes none (padding is attended).
  at::Tensor forward(const at::Tensor& ids, const std::optional<at::Tensor>& mask = std::nullopt);
  torch::nn::Embedding shared{nullptr};
  T5Stack encoder{nullptr};
  T5Options options;
};
TORCH_MODULE(T5Encoder);

}  // namespace flowtrain::models
