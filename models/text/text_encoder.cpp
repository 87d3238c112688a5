#include "models/text/text_encoder.h"

#include "models/layers.h"

#include <torch/nn/init.h>

namespace flowtrain::models {

TextEncoderLayerImpl::TextEncoderLayerImpl(int64_t width, int64_t heads, int64_t mlp_hidden) : heads(heads) {
  TORCH_CHECK(width % heads == 0, "TextEncoder: width ", width, " not divisible by heads ", heads);
  norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
  qkv = register_module("qkv", Linear(width, 3 * width));
  proj = register_module("proj", Linear(width, width));
  norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
  fc1 = register_module("fc1", Linear(width, mlp_hidden));
  fc2 = register_module("fc2", Linear(mlp_hidden, width));
}

at::Tensor TextEncoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& attend) {
  const int64_t B = x.size(0), L = x.size(1), W = x.size(2);
  // "B L (K H D) -> K B H L D"
  const auto qkv_heads = qkv(norm1->forward(x)).reshape({B, L, 3, heads, W / heads}).permute({2, 0, 3, 1, 4}).unbind(0);
  const at::Tensor attn = at::scaled_dot_product_attention(qkv_heads[0], qkv_heads[1], qkv_heads[2], attend);
  at::Tensor h = x + proj(attn.transpose(1, 2).reshape({B, L, W}));
  return h + fc2(gelu_tanh(fc1(norm2->forward(h))));
}

TextEncoderImpl::TextEncoderImpl(const TextEncoderOptions& o) : options(o) {
  token_embedding = register_module("token_embedding", torch::nn::Embedding(o.vocab_size, o.width));
  position_embedding = register_parameter("position_embedding", at::zeros({o.length, o.width}));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.depth; ++i)
    layers->push_back(TextEncoderLayer(o.width, o.heads, static_cast<int64_t>(o.width * o.mlp_ratio)));
  final_norm = register_module("final_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.width})));
  pooled_proj = register_module("pooled_proj", Linear(o.width, o.pooled_dim));

  at::NoGradGuard no_grad;
  xavier_init_linears(*this);
  torch::nn::init::normal_(token_embedding->weight, 0.0, 0.02);
  torch::nn::init::normal_(position_embedding, 0.0, 0.02);
}

TextEncoderImpl::Output TextEncoderImpl::forward(const at::Tensor& tokens, const at::Tensor& mask) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.sizes() == mask.sizes(), "TextEncoder: tokens and mask must be [B, L]");
  const int64_t L = tokens.size(1);
  TORCH_CHECK(L <= options.length, "TextEncoder: ", L, " tokens, but the encoder has ", options.length, " positions");
  const at::Tensor has_text = mask.any(1);  // [B]
  // A row without tokens attends to all its (padding) positions so softmax stays finite; its
  // output is zeroed below.
  const at::Tensor attend = at::logical_or(mask, at::logical_not(has_text).unsqueeze(1)).reshape({mask.size(0), 1, 1, L});
  at::Tensor x = token_embedding->forward(tokens) + position_embedding.narrow(0, 0, L);
  for (const auto& layer : *layers) x = layer->as<TextEncoderLayer>()->forward(x, attend);
  const at::Tensor real = mask.unsqueeze(2).to(x.scalar_type());  // [B, L, 1]
  const at::Tensor txt = final_norm->forward(x) * real;
  const at::Tensor count = real.sum(1).clamp_min(1.0);  // [B, 1]
  const at::Tensor pooled = pooled_proj(txt.sum(1) / count);
  return {txt, pooled * has_text.unsqueeze(1).to(pooled.scalar_type())};
}

int64_t text_encoder_parameter_count(const TextEncoderOptions& o) {
  const int64_t W = o.width, M = static_cast<int64_t>(W * o.mlp_ratio);
  const int64_t layer = 2 * 2 * W + (W * 3 * W + 3 * W) + (W * W + W) + (W * M + M) + (M * W + W);
  return o.vocab_size * W + o.length * W + o.depth * layer + 2 * W + (W * o.pooled_dim + o.pooled_dim);
}

double text_encoder_forward_flops_per_sample(const TextEncoderOptions& o) {
  const double W = double(o.width), M = W * o.mlp_ratio, L = double(o.length);
  const double layer = L * 2.0 * (3 * W * W + W * W + 2 * W * M) + L * 4.0 * L * W;
  return o.depth * layer + 2.0 * W * o.pooled_dim;
}

double text_encoder_saved_per_sample(const TextEncoderOptions& o) {
  const double W = double(o.width), M = W * o.mlp_ratio, L = double(o.length);
  return o.depth * (L * (9 * W + 2 * M) + o.heads * L) + L * 2 * W + W;
}

}  // namespace flowtrain::models
