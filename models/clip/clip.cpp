#include "models/clip/clip.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace flowtrain::models {

ClipTextOptions clip_l_text_options() { return ClipTextOptions{}; }

int64_t clip_text_parameter_count(const ClipTextOptions& o) {
  const int64_t D = o.hidden;
  const int64_t per_layer = 4 * (D * D + D) + 2 * 2 * D + (D * o.intermediate + o.intermediate) + (o.intermediate * D + D);
  return o.vocab_size * D + o.max_positions * D + o.layers * per_layer + 2 * D;
}

ClipAttentionImpl::ClipAttentionImpl(int64_t hidden, int64_t heads) : heads(heads) {
  // The reference's registration order (its state_dict's): k, v, q, out.
  k_proj = register_module("k_proj", Linear(hidden, hidden));
  v_proj = register_module("v_proj", Linear(hidden, hidden));
  q_proj = register_module("q_proj", Linear(hidden, hidden));
  out_proj = register_module("out_proj", Linear(hidden, hidden));
}

at::Tensor ClipAttentionImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), L = x.size(1), D = x.size(2);
  auto split = [&](const at::Tensor& t) { return t.view({B, L, heads, D / heads}).transpose(1, 2); };
  const at::Tensor a = at::scaled_dot_product_attention(split(q_proj(x)), split(k_proj(x)), split(v_proj(x)),
                                                        /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
  return out_proj(a.transpose(1, 2).reshape({B, L, D}));
}

ClipMlpImpl::ClipMlpImpl(int64_t hidden, int64_t intermediate) {
  fc1 = register_module("fc1", Linear(hidden, intermediate));
  fc2 = register_module("fc2", Linear(intermediate, hidden));
}

at::Tensor ClipMlpImpl::forward(const at::Tensor& x) {
  const at::Tensor h = fc1(x);
  return fc2(h * at::sigmoid(1.702 * h));  // quick_gelu
}

ClipEncoderLayerImpl::ClipEncoderLayerImpl(const ClipTextOptions& o) {
  auto norm = [&] { return torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.hidden}).eps(o.layer_norm_eps)); };
  self_attn = register_module("self_attn", ClipAttention(o.hidden, o.heads));
  layer_norm1 = register_module("layer_norm1", norm());
  mlp = register_module("mlp", ClipMlp(o.hidden, o.intermediate));
  layer_norm2 = register_module("layer_norm2", norm());
}

at::Tensor ClipEncoderLayerImpl::forward(const at::Tensor& x) {
  const at::Tensor h = x + self_attn(layer_norm1(x));
  return h + mlp(layer_norm2(h));
}

ClipTextEmbeddingsImpl::ClipTextEmbeddingsImpl(const ClipTextOptions& o) {
  token_embedding = register_module("token_embedding", torch::nn::Embedding(o.vocab_size, o.hidden));
  position_embedding = register_module("position_embedding", torch::nn::Embedding(o.max_positions, o.hidden));
}

ClipTextStackImpl::ClipTextStackImpl(const ClipTextOptions& o) {
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.layers; ++i) layers->push_back(ClipEncoderLayer(o));
}

ClipTextTransformerImpl::ClipTextTransformerImpl(const ClipTextOptions& o) {
  embeddings = register_module("embeddings", ClipTextEmbeddings(o));
  encoder = register_module("encoder", ClipTextStack(o));
  final_layer_norm = register_module(
      "final_layer_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.hidden}).eps(o.layer_norm_eps)));
}

ClipTextEncoderImpl::ClipTextEncoderImpl(ClipTextOptions o) : options(std::move(o)) {
  text_model = register_module("text_model", ClipTextTransformer(options));
}

ClipTextOutput ClipTextEncoderImpl::forward(const at::Tensor& ids) {
  const int64_t L = ids.size(1);
  if (L > options.max_positions)
    throw std::invalid_argument("CLIP text encoder: " + std::to_string(L) + " tokens, more than its " +
                                std::to_string(options.max_positions) + " positions");
  auto& e = text_model->embeddings;
  at::Tensor h = e->token_embedding(ids) + e->position_embedding(at::arange(L, ids.options()));
  for (const auto& layer : *text_model->encoder->layers) h = layer->as<ClipEncoderLayer>()->forward(h);
  h = text_model->final_layer_norm(h);
  // argmax returns the first of equal maxima, as the reference relies on.
  const at::Tensor end = options.eos_token_id == 2 ? ids.argmax(-1) : (ids == options.eos_token_id).to(at::kInt).argmax(-1);
  const int64_t B = ids.size(0), D = h.size(2);
  const at::Tensor rows = at::arange(B, end.options()) * L + end;
  return {h, h.reshape({B * L, D}).index_select(0, rows)};
}

}  // namespace flowtrain::models
