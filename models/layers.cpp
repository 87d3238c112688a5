#include "models/layers.h"

#include <torch/nn/init.h>

#include <torch/nn/modules/activation.h>

#include "models/kernels/cpu_fused.h"
#include "models/kernels/cuda/cuda_fused.h"

#include <algorithm>
#include <cmath>

namespace flowtrain::models {

at::Tensor math_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const double scale = 1.0 / std::sqrt(double(q.size(-1)));
  return at::matmul(at::softmax(at::matmul(q * scale, k.transpose(-2, -1)), -1), v);
}

namespace {
at::Tensor default_attention_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const bool short_cpu = q.device().is_cpu() && q.scalar_type() == at::kFloat &&
                         std::max(q.size(-2), k.size(-2)) <= kMathAttentionMaxTokens;
  return short_cpu ? math_attention(q, k, v) : at::scaled_dot_product_attention(q, k, v);
}
using AttentionKernelPtr = at::Tensor (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&);
}  // namespace

AttentionSaves default_attention_saves(bool cpu_fp32, int64_t tokens) {
  return cpu_fp32 && tokens <= kMathAttentionMaxTokens ? AttentionSaves::Probabilities : AttentionSaves::LogSumExp;
}

AttentionFn default_attention() { return AttentionFn(&default_attention_kernel); }

bool is_default_attention(const AttentionFn& fn) {
  const AttentionKernelPtr* target = fn.target<AttentionKernelPtr>();
  return target != nullptr && *target == &default_attention_kernel;
}

void xavier_init_linears(torch::nn::Module& model) {
  at::NoGradGuard no_grad;
  for (const auto& module : model.modules(/*include_self=*/false)) {
    if (auto* linear = module->as<Linear>()) {
      torch::nn::init::xavier_uniform_(linear->weight);
      if (linear->bias.defined()) torch::nn::init::zeros_(linear->bias);
    }
  }
}

at::Tensor gelu_tanh(const at::Tensor& x) {
  return cpu_fused::supports_gelu_tanh(x) ? cpu_fused::gelu_tanh(x) : at::gelu(x, "tanh");
}

at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
}

constexpr double kLayerNormEps = 1e-6;

at::Tensor layer_norm_no_affine(const at::Tensor& x) {
  return at::layer_norm(x, {x.size(-1)}, /*weight=*/{}, /*bias=*/{}, kLayerNormEps);
}

at::Tensor adaln_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  if (cpu_fused::supports(x, {&shift, &scale})) return cpu_fused::adaln_modulate(x, shift, scale, kLayerNormEps);
  if (cuda_fused::supports_adaln_modulate(x, shift, scale))
    return cuda_fused::adaln_modulate(x, shift, scale, kLayerNormEps);
  return modulate(layer_norm_no_affine(x), shift, scale);
}

at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y) {
  if (cpu_fused::supports(x, {&gate}, &y)) return cpu_fused::gated_residual(x, gate, y);
  if (cuda_fused::supports_gated_residual(x, gate, y)) return cuda_fused::gated_residual(x, gate, y);
  return at::addcmul(x, gate.unsqueeze(1), y);
}

// 1-D table for positions `pos` [M]: [M, dim] = cat[sin(pos·ω), cos(pos·ω)], ω_k = 10000^(−k/(dim/2)).
static at::Tensor sincos_1d(int64_t dim, const at::Tensor& pos) {
  auto opts = at::TensorOptions().dtype(at::kDouble);
  at::Tensor omega = at::arange(dim / 2, opts) / (dim / 2.0);
  omega = 1.0 / at::pow(10000.0, omega);                    // [dim/2]
  at::Tensor angles = at::outer(pos.to(at::kDouble), omega);  // [M, dim/2]
  return at::cat({at::sin(angles), at::cos(angles)}, 1);
}

at::Tensor sincos_pos_embed_2d(int64_t dim, int64_t grid) {
  TORCH_CHECK(dim % 4 == 0, "sin-cos position table needs hidden % 4 == 0, got ", dim);
  auto opts = at::TensorOptions().dtype(at::kDouble);
  at::Tensor coords = at::arange(grid, opts);
  // Token n = row·grid + col. DiT builds meshgrid(w, h) and encodes grid[0] (the column index)
  // in the first half, grid[1] (the row index) in the second half.
  at::Tensor col = coords.repeat({grid});                     // n % grid
  at::Tensor row = coords.repeat_interleave(grid);            // n / grid
  at::Tensor table = at::cat({sincos_1d(dim / 2, col), sincos_1d(dim / 2, row)}, 1);
  return table.to(at::kFloat);
}

at::Tensor timestep_features(const at::Tensor& t, int64_t dim, double max_period) {
  const int64_t half = dim / 2;
  auto opts = at::TensorOptions().dtype(at::kFloat).device(t.device());
  at::Tensor freqs = at::exp(-std::log(max_period) * at::arange(half, opts) / half);  // [half]
  at::Tensor args = t.to(at::kFloat).unsqueeze(1) * freqs.unsqueeze(0);             // [B, half]
  at::Tensor emb = at::cat({at::cos(args), at::sin(args)}, -1);
  if (dim % 2) emb = at::cat({emb, at::zeros_like(emb.narrow(1, 0, 1))}, -1);
  return emb;
}

PatchEmbedImpl::PatchEmbedImpl(int64_t in_channels, int64_t hidden, int64_t patch) {
  proj = register_module(
      "proj", torch::nn::Conv2d(torch::nn::Conv2dOptions(in_channels, hidden, patch).stride(patch)));
}

at::Tensor PatchEmbedImpl::forward(const at::Tensor& x) {
  return proj->forward(x).flatten(2).transpose(1, 2).contiguous();  // [B, D, h, w] -> [B, h·w, D]
}

TimestepEmbedderImpl::TimestepEmbedderImpl(int64_t hidden, int64_t frequency_dim)
    : frequency_dim(frequency_dim) {
  mlp = register_module("mlp", torch::nn::Sequential(Linear(frequency_dim, hidden),
                                                     torch::nn::SiLU(), Linear(hidden, hidden)));
}

at::Tensor TimestepEmbedderImpl::forward(const at::Tensor& t) {
  at::Tensor features = timestep_features(t, frequency_dim);
  // Under bf16 autocast the linears cast their input; in fp32 runs this is a no-op.
  return mlp->forward(features);
}

LabelEmbedderImpl::LabelEmbedderImpl(int64_t num_classes, int64_t hidden) : num_classes(num_classes) {
  embedding_table = register_module("embedding_table", torch::nn::Embedding(num_classes + 1, hidden));
}

at::Tensor LabelEmbedderImpl::forward(const at::Tensor& labels) {
  return embedding_table->forward(labels);
}

AttentionImpl::AttentionImpl(int64_t hidden, int64_t heads, AttentionFn attention)
    : heads(heads), attention(std::move(attention)) {
  qkv = register_module("qkv", Linear(hidden, 3 * hidden));
  proj = register_module("proj", Linear(hidden, hidden));
}

at::Tensor AttentionImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), N = x.size(1), D = x.size(2);
  // [B, N, 3·D] -> [B, N, 3, H, Dh] -> q, k, v [B, N, H, Dh] -> [B, H, N, Dh]: timm's layout
  // (views, no copy). unbind rather than permute + index: its backward stacks the three
  // gradients straight into the [B, N, 3·D] layout of the qkv output (indexing would build three
  // zero-filled [3, B, H, N, Dh] tensors, add them and copy the sum back to [B, N, 3·D]).
  const at::Tensor qkv_out = qkv(x);
  if (is_default_attention(attention) && cpu_fused::supports_qkv_attention(qkv_out, heads))
    return proj(cpu_fused::qkv_attention(qkv_out, heads));  // same math, no transposes
  const auto qkv_parts = qkv_out.reshape({B, N, 3, heads, D / heads}).unbind(2);
  at::Tensor out = attention(qkv_parts[0].transpose(1, 2), qkv_parts[1].transpose(1, 2),
                             qkv_parts[2].transpose(1, 2));  // [B, H, N, Dh]
  return proj(out.transpose(1, 2).reshape({B, N, D}));
}

MlpImpl::MlpImpl(int64_t hidden, int64_t mlp_hidden) {
  fc1 = register_module("fc1", Linear(hidden, mlp_hidden));
  fc2 = register_module("fc2", Linear(mlp_hidden, hidden));
}

at::Tensor MlpImpl::forward(const at::Tensor& x) {
  const at::Tensor h = fc1(x);
  return fc2(gelu_tanh(h));
}

}  // namespace flowtrain::models
