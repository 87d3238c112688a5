#include "models/t5/t5.h"

#include <ATen/Dispatch.h>

#include <cmath>
#include <limits>

namespace flowtrain::models {

T5Options t5_xxl_options() { return T5Options{}; }

int64_t t5_encoder_parameter_count(const T5Options& o) {
  const int64_t inner = o.num_heads * o.d_kv;
  const int64_t per_layer = 4 * o.d_model * inner + 3 * o.d_model * o.d_ff + 2 * o.d_model;
  return o.vocab_size * o.d_model + o.num_layers * per_layer + o.relative_attention_num_buckets * o.num_heads +
         o.d_model;
}

at::Tensor t5_relative_position_bucket(const at::Tensor& relative_position, int64_t num_buckets, int64_t max_distance) {
  // Bidirectional: half the buckets for keys after the query, half for before.
  const int64_t half = num_buckets / 2;
  const at::Tensor after = (relative_position > 0).to(at::kLong) * half;
  const at::Tensor distance = relative_position.abs();
  // Below max_exact each distance has its bucket; beyond, buckets grow logarithmically up to
  // max_distance, and everything farther shares the last.
  const int64_t max_exact = half / 2;
  const at::Tensor log_bucket =
      max_exact + (at::log(distance.to(at::kFloat) / max_exact) / std::log(static_cast<double>(max_distance) / max_exact) *
                   (half - max_exact))
                      .to(at::kLong);
  const at::Tensor far = at::clamp_max(log_bucket, half - 1);
  return after + at::where(distance < max_exact, distance, far);
}

T5LayerNormImpl::T5LayerNormImpl(int64_t dim, double eps) : eps(eps) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor T5LayerNormImpl::forward(const at::Tensor& x) {
  const at::Tensor variance = x.to(at::kFloat).pow(2).mean(-1, /*keepdim=*/true);
  at::Tensor h = x * at::rsqrt(variance + eps);
  if (weight.scalar_type() == at::kHalf || weight.scalar_type() == at::kBFloat16) h = h.to(weight.scalar_type());
  return weight * h;
}

T5AttentionImpl::T5AttentionImpl(const T5Options& o, bool has_relative_attention_bias) : options(o) {
  const int64_t inner = o.num_heads * o.d_kv;
  q = register_module("q", Linear(o.d_model, inner, false));
  k = register_module("k", Linear(o.d_model, inner, false));
  v = register_module("v", Linear(o.d_model, inner, false));
  this->o = register_module("o", Linear(inner, o.d_model, false));
  if (has_relative_attention_bias)
    relative_attention_bias = register_module(
        "relative_attention_bias", torch::nn::Embedding(o.relative_attention_num_buckets, o.num_heads));
}

at::Tensor T5AttentionImpl::position_bias(int64_t length) {
  const at::Tensor positions = at::arange(length, relative_attention_bias->weight.options().dtype(at::kLong));
  const at::Tensor relative = positions.unsqueeze(0) - positions.unsqueeze(1);  // [query, key]: key − query
  const at::Tensor buckets = t5_relative_position_bucket(relative, options.relative_attention_num_buckets,
                                                         options.relative_attention_max_distance);
  return relative_attention_bias(buckets).permute({2, 0, 1}).unsqueeze(0);  // [1, H, L, L]
}

at::Tensor T5AttentionImpl::forward(const at::Tensor& x, const at::Tensor& bias) {
  const int64_t B = x.size(0), L = x.size(1), H = options.num_heads;
  auto heads = [&](const at::Tensor& t) { return t.view({B, L, H, options.d_kv}).transpose(1, 2); };
  const at::Tensor scores = at::matmul(heads(q(x)), heads(k(x)).transpose(2, 3)) + bias;  // no 1/√d_kv
  const at::Tensor weights = at::softmax(scores.to(at::kFloat), -1).to(scores.scalar_type());
  return o(at::matmul(weights, heads(v(x))).transpose(1, 2).reshape({B, L, H * options.d_kv}));
}

T5LayerSelfAttentionImpl::T5LayerSelfAttentionImpl(const T5Options& o, bool has_relative_attention_bias) {
  SelfAttention = register_module("SelfAttention", T5Attention(o, has_relative_attention_bias));
  layer_norm = register_module("layer_norm", T5LayerNorm(o.d_model, o.layer_norm_eps));
}

T5DenseGatedGeluImpl::T5DenseGatedGeluImpl(const T5Options& o) {
  wi_0 = register_module("wi_0", Linear(o.d_model, o.d_ff, false));
  wi_1 = register_module("wi_1", Linear(o.d_model, o.d_ff, false));
  wo = register_module("wo", Linear(o.d_ff, o.d_model, false));
}

at::Tensor T5DenseGatedGeluImpl::forward(const at::Tensor& x) {
  return wo(at::gelu(wi_0(x), "tanh") * wi_1(x));  // T5 v1.1's gelu_new is GELU's tanh form
}

T5LayerFFImpl::T5LayerFFImpl(const T5Options& o) {
  DenseReluDense = register_module("DenseReluDense", T5DenseGatedGelu(o));
  layer_norm = register_module("layer_norm", T5LayerNorm(o.d_model, o.layer_norm_eps));
}

T5BlockImpl::T5BlockImpl(const T5Options& o, bool has_relative_attention_bias) {
  layer = register_module("layer", torch::nn::ModuleList());
  layer->push_back(T5LayerSelfAttention(o, has_relative_attention_bias));
  layer->push_back(T5LayerFF(o));
}

at::Tensor T5BlockImpl::forward(const at::Tensor& h, const at::Tensor& bias) {
  auto* attention = layer[0]->as<T5LayerSelfAttention>();
  auto* ff = layer[1]->as<T5LayerFF>();
  const at::Tensor a = h + attention->SelfAttention(attention->layer_norm(h), bias);
  return a + ff->DenseReluDense(ff->layer_norm(a));
}

T5StackImpl::T5StackImpl(const T5Options& o) {
  block = register_module("block", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.num_layers; ++i) block->push_back(T5Block(o, /*has_relative_attention_bias=*/i == 0));
  final_layer_norm = register_module("final_layer_norm", T5LayerNorm(o.d_model, o.layer_norm_eps));
}

T5EncoderImpl::T5EncoderImpl(T5Options o) : options(std::move(o)) {
  shared = register_module("shared", torch::nn::Embedding(options.vocab_size, options.d_model));
  encoder = register_module("encoder", T5Stack(options));
}

at::Tensor T5EncoderImpl::forward(const at::Tensor& ids, const std::optional<at::Tensor>& mask) {
  at::Tensor h = shared(ids);
  auto* first = encoder->block[0]->as<T5Block>()->layer[0]->as<T5LayerSelfAttention>();
  at::Tensor bias = first->SelfAttention->position_bias(ids.size(1));  // block 0's, shared by all
  if (mask) {
    // A padding key gets its dtype's lowest value added (the reference's finfo.min), so softmax gives it 0.
    double lowest = 0;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, bias.scalar_type(), "t5_padding_mask",
                                    [&] { lowest = static_cast<double>(std::numeric_limits<scalar_t>::lowest()); });
    const at::Tensor padding = ~mask->view({ids.size(0), 1, 1, ids.size(1)});
    bias = bias + at::zeros(padding.sizes(), bias.options()).masked_fill(padding, lowest);
  }
  for (const auto& block : *encoder->block) h = block->as<T5Block>()->forward(h, bias);
  return encoder->final_layer_norm(h);
}

}  // namespace flowtrain::models
