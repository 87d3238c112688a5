#include "models/flux/flux.h"

#include "models/kernels/cuda/cuda_fused.h"

#include "models/flux/rope.h"

#include <fmt/format.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/activation.h>

#include <numeric>
#include <stdexcept>

namespace flowtrain::models {

// ---- sizes, counts, costs ---------------------------------------------------------------------

namespace {
struct FluxSize {
  const char* name;
  int64_t hidden, heads, depth, depth_single;
  std::vector<int64_t> axes_dim;
  int64_t context_dim, vec_dim;
  bool guidance;
};
const std::vector<FluxSize>& flux_sizes() {
  static const std::vector<FluxSize> sizes = {
      {"flux-dev", 3072, 24, 19, 38, {16, 56, 56}, 4096, 768, true},
      {"flux-schnell", 3072, 24, 19, 38, {16, 56, 56}, 4096, 768, false},
      // CPU sizes, their RoPE axes split like Flux's (16, 56, 56) of 128. flux-small is
      // configs/fashion_t2i.yaml's model: head dim 48 = (8, 20, 20), text widths 128.
      {"flux-small", 192, 4, 2, 4, {8, 20, 20}, 128, 128, false},
      {"flux-tiny", 64, 2, 1, 2, {8, 12, 12}, 32, 16, false},
  };
  return sizes;
}
int64_t linear_params(int64_t in, int64_t out, bool bias = true) { return in * out + (bias ? out : 0); }
}  // namespace

std::vector<std::string> flux_size_names() {
  std::vector<std::string> names;
  for (const auto& s : flux_sizes()) names.emplace_back(s.name);
  return names;
}

FluxOptions flux_size(const std::string& name, FluxOptions base) {
  for (const auto& s : flux_sizes()) {
    if (name != s.name) continue;
    base.hidden = s.hidden;
    base.heads = s.heads;
    base.depth = s.depth;
    base.depth_single = s.depth_single;
    base.axes_dim = s.axes_dim;
    base.context_dim = s.context_dim;
    base.vec_dim = s.vec_dim;
    base.guidance_embed = s.guidance;
    return base;
  }
  throw std::invalid_argument("unknown Flux size '" + name + "' (expected flux-dev|flux-schnell|flux-small|flux-tiny)");
}

std::vector<UnitFootprint> flux_unit_footprints(const FluxOptions& o, AttentionSaves attention) {
  const int64_t D = o.hidden, M = o.mlp_hidden(), Dh = o.head_dim(), H = o.heads;
  const double Li = double(o.image_tokens()), Lt = double(o.text_len), T = Li + Lt;
  // What one attention call keeps beyond q, k, v: the [H, T, T] probabilities and the scaled q
  // that multiplied them (math path), or the output and the [H, T] log-sum-exp (SDPA).
  const bool math = attention == AttentionSaves::Probabilities;
  const double kept_by_attention = math ? H * T * T + T * D : T * D + H * T;
  const double score_gradients = math ? 2 * H * T * T : 0;  // ∂P and ∂S of the math path's backward
  std::vector<UnitFootprint> units;

  // Stem: the embedders. Linears keep their inputs: the packed tokens, the text embeddings, the
  // 256 timestep features (twice with guidance) and the pooled vector; the RoPE angles
  // [T, Dh/2, 2] (fp32) are computed once and kept by every block's rotation.
  const int64_t embed = linear_params(256, D) + linear_params(D, D);  // an MLPEmbedder from 256 features
  UnitFootprint stem{"stem"};
  stem.parameters = linear_params(o.token_dim(), D) + embed + linear_params(o.vec_dim, D) + linear_params(D, D) +
                    linear_params(o.context_dim, D) + (o.guidance_embed ? embed : 0);
  stem.saved = Li * o.token_dim() + Lt * o.context_dim + T * Dh + (o.guidance_embed ? 2 : 1) * (256 + D) +
               o.vec_dim + D;
  units.push_back(stem);

  // A double-stream block, per token of the joint sequence: its input (kept by the first
  // LayerNorm), then in the attention sublayer the modulated input (1), qkv (3), the RMS-normed
  // q and k (2), the joint q, k, v concatenated over [txt, img] (3), the rotated q and k (2),
  // what the attention kernel keeps, the [T, D] copy of its output that proj reads (1); the proj
  // output kept by the gated residual (1); the residual stream (1, the second LayerNorm's input),
  // in the MLP sublayer the modulated input (1), the GELU's input and output (2·M/D); the MLP
  // output kept by its gated residual (1). Per sample: 2 × 6 modulation chunks and SiLU(vec).
  const int64_t stream = linear_params(D, 6 * D) + linear_params(D, 3 * D, o.qkv_bias) + 2 * Dh +
                         linear_params(D, D) + linear_params(D, M) + linear_params(M, D);
  for (int64_t i = 0; i < o.depth; ++i) {
    UnitFootprint b{fmt::format("double_blocks.{}", i)};
    b.parameters = 2 * stream;
    b.input = T * D + D;
    b.attention = T * (12 * D) + kept_by_attention;
    b.mlp = T * (D + 2 * M);
    b.saved = b.input + b.attention + b.mlp + T * (3 * D) + 14 * D;
    b.backward_working = T * (2 * D + M) + score_gradients;
    units.push_back(b);
  }

  // A single-stream block on the joint sequence: its input (1), the modulated input (1), linear1's
  // output qkv ‖ mlp (3 + M/D, kept whole: q, k, v and the GELU's input are views of it), the
  // RMS-normed and rotated q and k (4), what the attention kernel keeps, linear2's input
  // cat(attention, GELU) (1 + M/D), its output kept by the gated residual (1). Per sample: the 3
  // modulation chunks and SiLU(vec).
  const int64_t single = linear_params(D, 3 * D + M) + linear_params(D + M, D) + 2 * Dh + linear_params(D, 3 * D);
  for (int64_t j = 0; j < o.depth_single; ++j) {
    UnitFootprint b{fmt::format("single_blocks.{}", j)};
    b.parameters = single;
    b.input = T * D + D;
    b.attention = T * (4 * D) + kept_by_attention;
    b.mlp = T * (D + M);
    b.saved = b.input + T * (D + 3 * D + M + D) + b.attention + b.mlp + 4 * D;
    b.backward_working = T * (2 * D + 3 * D + M) + score_gradients;
    units.push_back(b);
  }

  // Head: the final layer reads the image tokens of the last block's output (a view: the whole
  // [T, D] stays), its modulated input; the objective keeps the prediction, target and their
  // difference (3 token_dim a token).
  UnitFootprint head{"head"};
  head.parameters = linear_params(D, o.token_dim()) + linear_params(D, 2 * D);
  head.saved = T * D + Li * D + 3 * Li * o.token_dim() + 3 * D;
  units.push_back(head);
  return units;
}

int64_t flux_parameter_count(const FluxOptions& o) {
  int64_t n = 0;
  for (const auto& u : flux_unit_footprints(o, AttentionSaves::LogSumExp)) n += u.parameters;
  return n;
}

double flux_forward_flops_per_sample(const FluxOptions& o) {
  const double D = double(o.hidden), M = double(o.mlp_hidden()), Li = double(o.image_tokens()),
               Lt = double(o.text_len), T = Li + Lt;
  double f = 2.0 * o.token_dim() * D * Li + 2.0 * o.context_dim * D * Lt;                   // img_in, txt_in
  f += 2.0 * (256 * D + D * D) + 2.0 * (o.vec_dim * D + D * D);                            // time_in, vector_in
  if (o.guidance_embed) f += 2.0 * (256 * D + D * D);                                       // guidance_in
  const double double_block = T * 2.0 * (3 * D * D + D * D + 2 * D * M) + T * 4.0 * T * D + 2.0 * (2 * D * 6 * D);
  const double single_block = T * 2.0 * (D * (3 * D + M) + (D + M) * D) + T * 4.0 * T * D + 2.0 * (D * 3 * D);
  f += o.depth * double_block + o.depth_single * single_block;
  f += 2.0 * D * 2 * D + 2.0 * D * o.token_dim() * Li;                                     // final layer
  return f;
}

// ---- packing and ids -------------------------------------------------------------------------

at::Tensor pack_latents(const at::Tensor& x, int64_t p) {
  const int64_t B = x.size(0), C = x.size(1), h = x.size(2) / p, w = x.size(3) / p;
  // [B, C, h, p, w, p] -> [B, h, w, C, p, p] -> [B, h·w, C·p·p]
  return x.reshape({B, C, h, p, w, p}).permute({0, 2, 4, 1, 3, 5}).reshape({B, h * w, C * p * p});
}

at::Tensor unpack_latents(const at::Tensor& tokens, int64_t C, int64_t p, int64_t h, int64_t w) {
  const int64_t B = tokens.size(0);
  return tokens.reshape({B, h, w, C, p, p}).permute({0, 3, 1, 4, 2, 5}).reshape({B, C, h * p, w * p});
}

at::Tensor pack_video_latents(const at::Tensor& x, int64_t pt, int64_t p) {
  const int64_t B = x.size(0), C = x.size(1), t = x.size(2) / pt, h = x.size(3) / p, w = x.size(4) / p;
  // [B, C, t, pt, h, p, w, p] -> [B, t, h, w, C, pt, p, p] -> [B, t·h·w, C·pt·p·p]
  return x.reshape({B, C, t, pt, h, p, w, p})
      .permute({0, 2, 4, 6, 1, 3, 5, 7})
      .reshape({B, t * h * w, C * pt * p * p});
}

at::Tensor unpack_video_latents(const at::Tensor& tokens, int64_t C, int64_t pt, int64_t p, int64_t t, int64_t h,
                                int64_t w) {
  const int64_t B = tokens.size(0);
  return tokens.reshape({B, t, h, w, C, pt, p, p})
      .permute({0, 4, 1, 5, 2, 6, 3, 7})
      .reshape({B, C, t * pt, h * p, w * p});
}

at::Tensor video_ids(int64_t batch, int64_t t, int64_t h, int64_t w, const at::TensorOptions& options) {
  const auto f32 = options.dtype(at::kFloat);
  at::Tensor ids = at::zeros({t, h, w, 3}, f32);
  ids.select(3, 0).add_(at::arange(t, f32).view({t, 1, 1}));
  ids.select(3, 1).add_(at::arange(h, f32).view({1, h, 1}));
  ids.select(3, 2).add_(at::arange(w, f32).view({1, 1, w}));
  return ids.reshape({1, t * h * w, 3}).expand({batch, t * h * w, 3});
}

at::Tensor image_ids(int64_t batch, int64_t h, int64_t w, const at::TensorOptions& options) {
  return video_ids(batch, 1, h, w, options);
}

// ---- layers ----------------------------------------------------------------------------------

RmsNormImpl::RmsNormImpl(int64_t dim) { scale = register_parameter("scale", at::ones({dim})); }

at::Tensor RmsNormImpl::forward(const at::Tensor& x) {
  // CUDA: one fused pass each way with the same fp32 math and rounding.
  if (cuda_fused::supports_qk_rmsnorm(x, scale)) return cuda_fused::qk_rmsnorm(x, scale, 1e-6);
  const at::Tensor xf = x.to(at::promote_types(x.scalar_type(), at::kFloat));  // at least fp32, as the reference
  const at::Tensor rrms = at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + 1e-6);
  return (xf * rrms).to(x.scalar_type()) * scale;
}

QkNormImpl::QkNormImpl(int64_t head_dim) {
  query_norm = register_module("query_norm", RmsNorm(head_dim));
  key_norm = register_module("key_norm", RmsNorm(head_dim));
}

std::pair<at::Tensor, at::Tensor> QkNormImpl::forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return {query_norm->forward(q).to(v.scalar_type()), key_norm->forward(k).to(v.scalar_type())};
}

MlpEmbedderImpl::MlpEmbedderImpl(int64_t in_dim, int64_t hidden) {
  in_layer = register_module("in_layer", Linear(in_dim, hidden));
  out_layer = register_module("out_layer", Linear(hidden, hidden));
}

at::Tensor MlpEmbedderImpl::forward(const at::Tensor& x) {
  return out_layer(at::silu(in_layer(x)));
}

ModulationImpl::ModulationImpl(int64_t hidden, int64_t chunks) : chunks(chunks) {
  lin = register_module("lin", Linear(hidden, chunks * hidden));
}

std::vector<at::Tensor> ModulationImpl::forward(const at::Tensor& vec) {
  return lin(at::silu(vec)).chunk(chunks, /*dim=*/1);  // each [B, D]
}

FluxSelfAttentionImpl::FluxSelfAttentionImpl(int64_t hidden, int64_t heads, bool qkv_bias) : heads(heads) {
  // Registration order = the reference's state_dict order: qkv, norm, proj.
  qkv = register_module("qkv", Linear(hidden, 3 * hidden, qkv_bias));
  norm = register_module("norm", QkNorm(hidden / heads));
  proj = register_module("proj", Linear(hidden, hidden));
}

namespace {
// "B L (K H D) -> K B H L D" on a [B, L, 3·D] projection.
std::vector<at::Tensor> split_heads(const at::Tensor& qkv, int64_t heads) {
  const int64_t B = qkv.size(0), L = qkv.size(1), D = qkv.size(2) / 3;
  return qkv.reshape({B, L, 3, heads, D / heads}).permute({2, 0, 3, 1, 4}).unbind(0);
}
at::Tensor mlp_forward(torch::nn::Sequential mlp, const at::Tensor& x) {  // [Linear, GELU(tanh), Linear]
  // The Sequential keeps the reference's keys (img_mlp.0 / .2); gelu_tanh picks the fused kernel.
  return mlp[2]->as<Linear>()->forward(gelu_tanh(mlp[0]->as<Linear>()->forward(x)));
}
torch::nn::Sequential make_mlp(int64_t hidden, int64_t mlp_hidden) {
  return torch::nn::Sequential(Linear(hidden, mlp_hidden),
                               torch::nn::GELU(torch::nn::GELUOptions().approximate("tanh")),
                               Linear(mlp_hidden, hidden));
}
}  // namespace

std::vector<at::Tensor> FluxSelfAttentionImpl::project_qkv(const at::Tensor& x) {
  auto qkv_heads = split_heads(qkv(x), heads);
  auto [q, k] = norm->forward(qkv_heads[0], qkv_heads[1], qkv_heads[2]);
  return {q, k, qkv_heads[2]};
}

at::Tensor rope_attention(const AttentionFn& attention, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& angles) {
  at::Tensor out = attention(apply_rope(q, angles), apply_rope(k, angles), v);  // [B, H, L, Dh]
  return out.transpose(1, 2).reshape({out.size(0), out.size(2), out.size(1) * out.size(3)});  // "B H L D -> B L (H D)"
}

// ---- blocks ----------------------------------------------------------------------------------

DoubleStreamBlockImpl::DoubleStreamBlockImpl(int64_t hidden, int64_t heads, int64_t mlp_hidden, bool qkv_bias,
                                             AttentionFn attention)
    : attention(std::move(attention)) {
  // The reference's order: img_mod, img_attn, img_mlp, txt_mod, txt_attn, txt_mlp (norms have no parameters).
  img_mod = register_module("img_mod", Modulation(hidden, 6));
  img_attn = register_module("img_attn", FluxSelfAttention(hidden, heads, qkv_bias));
  img_mlp = register_module("img_mlp", make_mlp(hidden, mlp_hidden));
  txt_mod = register_module("txt_mod", Modulation(hidden, 6));
  txt_attn = register_module("txt_attn", FluxSelfAttention(hidden, heads, qkv_bias));
  txt_mlp = register_module("txt_mlp", make_mlp(hidden, mlp_hidden));
}

Tensors DoubleStreamBlockImpl::forward(const at::Tensor& img, const at::Tensor& txt, const at::Tensor& vec,
                                       const at::Tensor& angles, const SublayerFn& sublayer) {
  // Chunks: shift, scale, gate of the attention branch (mod1), then of the MLP branch (mod2).
  const auto im = img_mod->forward(vec), tm = txt_mod->forward(vec);
  const UnitCall joint_attention = [this](const Tensors& in) {  // img, txt, their shift/scale, angles
    const auto iq = img_attn->project_qkv(adaln_modulate(in[0], in[2], in[3]));
    const auto tq = txt_attn->project_qkv(adaln_modulate(in[1], in[4], in[5]));
    // Joint attention, text first: [txt, img] on the sequence.
    const at::Tensor attn = rope_attention(attention, at::cat({tq[0], iq[0]}, 2), at::cat({tq[1], iq[1]}, 2),
                                           at::cat({tq[2], iq[2]}, 2), in[6]);
    // split, not two narrows: its backward is one cat of the two gradients (a narrow's backward
    // zero-fills a full-size buffer for each piece and then adds them).
    const auto streams = attn.split_with_sizes({in[1].size(1), in[0].size(1)}, 1);
    return Tensors{img_attn->proj(streams[1]), txt_attn->proj(streams[0])};
  };
  const Tensors attn =
      run_sublayer(sublayer, Sublayer::Attention, joint_attention, {img, txt, im[0], im[1], tm[0], tm[1], angles});
  auto mlp_branch = [](torch::nn::Sequential mlp) -> UnitCall {
    return [mlp](const Tensors& in) { return Tensors{mlp_forward(mlp, adaln_modulate(in[0], in[1], in[2]))}; };
  };
  at::Tensor i = gated_residual(img, im[2], attn[0]);
  i = gated_residual(i, im[5], run_sublayer(sublayer, Sublayer::Mlp, mlp_branch(img_mlp), {i, im[3], im[4]})[0]);
  at::Tensor t = gated_residual(txt, tm[2], attn[1]);
  t = gated_residual(t, tm[5], run_sublayer(sublayer, Sublayer::Mlp, mlp_branch(txt_mlp), {t, tm[3], tm[4]})[0]);
  return {i, t};
}

SingleStreamBlockImpl::SingleStreamBlockImpl(int64_t hidden, int64_t heads, int64_t mlp_hidden, AttentionFn attention)
    : heads(heads), mlp_hidden(mlp_hidden), attention(std::move(attention)) {
  linear1 = register_module("linear1", Linear(hidden, 3 * hidden + mlp_hidden));
  linear2 = register_module("linear2", Linear(hidden + mlp_hidden, hidden));
  norm = register_module("norm", QkNorm(hidden / heads));
  modulation = register_module("modulation", Modulation(hidden, 3));
}

at::Tensor SingleStreamBlockImpl::forward(const at::Tensor& x, const at::Tensor& vec, const at::Tensor& angles,
                                          const SublayerFn& sublayer) {
  const auto mod = modulation->forward(vec);  // shift, scale, gate
  const int64_t D = x.size(2);
  const at::Tensor h = linear1(adaln_modulate(x, mod[0], mod[1]));
  const auto parts = h.split_with_sizes({3 * D, mlp_hidden}, 2);  // one cat in backward (see above)
  const UnitCall attention_branch = [this](const Tensors& in) {  // qkv, angles
    auto qkv_heads = split_heads(in[0], heads);
    auto [q, k] = norm->forward(qkv_heads[0], qkv_heads[1], qkv_heads[2]);
    return Tensors{rope_attention(attention, q, k, qkv_heads[2], in[1])};
  };
  const UnitCall mlp_branch = [this](const Tensors& in) {  // attention output, MLP pre-activation
    return Tensors{linear2(at::cat({in[0], gelu_tanh(in[1])}, 2))};
  };
  const at::Tensor attn = run_sublayer(sublayer, Sublayer::Attention, attention_branch, {parts[0], angles})[0];
  return gated_residual(x, mod[2], run_sublayer(sublayer, Sublayer::Mlp, mlp_branch, {attn, parts[1]})[0]);
}

FluxFinalLayerImpl::FluxFinalLayerImpl(int64_t hidden, int64_t out_features) {
  linear = register_module("linear", Linear(hidden, out_features));
  adaLN_modulation = register_module(
      "adaLN_modulation", torch::nn::Sequential(torch::nn::SiLU(), Linear(hidden, 2 * hidden)));
}

at::Tensor FluxFinalLayerImpl::forward(const at::Tensor& x, const at::Tensor& vec) {
  const auto mod = adaLN_modulation->forward(vec).chunk(2, /*dim=*/1);  // shift, scale
  return linear(adaln_modulate(x, mod[0], mod[1]));
}

// ---- model -----------------------------------------------------------------------------------

FluxImpl::FluxImpl(const FluxOptions& o, AttentionFn attention) : options(o) {
  TORCH_CHECK(o.hidden % o.heads == 0, "Flux: hidden ", o.hidden, " not divisible by heads ", o.heads);
  TORCH_CHECK(std::accumulate(o.axes_dim.begin(), o.axes_dim.end(), int64_t{0}) == o.head_dim(),
              "Flux: axes_dim must sum to the head dim ", o.head_dim());
  TORCH_CHECK(o.input_size % o.patch == 0, "Flux: input_size ", o.input_size, " not divisible by patch ", o.patch);
  TORCH_CHECK(o.frames >= 1 && o.patch_t >= 1 && o.frames % o.patch_t == 0, "Flux: frames ", o.frames,
              " not a positive multiple of patch_t ", o.patch_t);
  // Registration order = the reference's state_dict order.
  img_in = register_module("img_in", Linear(o.token_dim(), o.hidden));
  time_in = register_module("time_in", MlpEmbedder(256, o.hidden));
  vector_in = register_module("vector_in", MlpEmbedder(o.vec_dim, o.hidden));
  if (o.guidance_embed) guidance_in = register_module("guidance_in", MlpEmbedder(256, o.hidden));
  txt_in = register_module("txt_in", Linear(o.context_dim, o.hidden));
  double_blocks = register_module("double_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.depth; ++i)
    double_blocks->push_back(DoubleStreamBlock(o.hidden, o.heads, o.mlp_hidden(), o.qkv_bias, attention));
  single_blocks = register_module("single_blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.depth_single; ++i)
    single_blocks->push_back(SingleStreamBlock(o.hidden, o.heads, o.mlp_hidden(), attention));
  final_layer = register_module("final_layer", FluxFinalLayer(o.hidden, o.token_dim()));
  initialize_weights();
}

void FluxImpl::initialize_weights() {
  namespace init = torch::nn::init;
  at::NoGradGuard no_grad;
  xavier_init_linears(*this);
  for (MlpEmbedder* e : {&time_in, &vector_in, &guidance_in}) {
    if (!*e) continue;
    init::normal_((*e)->in_layer->weight, 0.0, 0.02);
    init::normal_((*e)->out_layer->weight, 0.0, 0.02);
  }
  auto zero = [](LinearImpl& l) {
    init::zeros_(l.weight);
    if (l.bias.defined()) init::zeros_(l.bias);
  };
  for (const auto& b : *double_blocks) {
    zero(*b->as<DoubleStreamBlock>()->img_mod->lin);
    zero(*b->as<DoubleStreamBlock>()->txt_mod->lin);
  }
  for (const auto& b : *single_blocks) zero(*b->as<SingleStreamBlock>()->modulation->lin);
  zero(*final_layer->adaLN_modulation[1]->as<Linear>());
  zero(*final_layer->linear);
}

at::Tensor FluxImpl::forward_tokens(const at::Tensor& img_tokens, const at::Tensor& img_ids, const at::Tensor& txt_tokens,
                                    const at::Tensor& txt_ids, const at::Tensor& timesteps, const at::Tensor& y,
                                    const at::Tensor& guidance) {
  TORCH_CHECK(img_tokens.dim() == 3 && txt_tokens.dim() == 3, "Flux: img and txt must be [B, L, ·]");
  at::Tensor img = img_in(img_tokens);
  at::Tensor vec = time_in->forward(timestep_features(timesteps * options.time_factor, 256));
  if (options.guidance_embed) {
    TORCH_CHECK(guidance.defined(), "Flux: a guidance-distilled model needs conditioning 'guidance'");
    vec = vec + guidance_in->forward(timestep_features(guidance * options.time_factor, 256));
  }
  vec = vec + vector_in->forward(y);
  at::Tensor txt = txt_in(txt_tokens);
  at::Tensor img_pos = img_ids, txt_pos = txt_ids;
  if (sequence_split.split) {
    // Context parallelism over the joint sequence: each stream's tokens split with their ids.
    img = sequence_split.split(img);
    txt = sequence_split.split(txt);
    img_pos = sequence_split.split(img_ids);
    txt_pos = sequence_split.split(txt_ids);
  }
  const at::Tensor angles = rope_angles(at::cat({txt_pos, img_pos}, 1), options.axes_dim, options.theta);

  const int64_t depth = options.depth;
  for (int64_t i = 0; i < depth; ++i) {
    DoubleStreamBlockImpl* block = double_blocks[i]->as<DoubleStreamBlock>();
    auto call = [block, sublayer = sublayer_fn(*this, i)](const Tensors& in) {
      return block->forward(in[0], in[1], in[2], in[3], sublayer);
    };
    Tensors out = unit_runner ? unit_runner(i, call, {img, txt, vec, angles}) : call({img, txt, vec, angles});
    img = out[0];
    txt = out[1];
  }
  at::Tensor x = at::cat({txt, img}, 1);
  for (int64_t j = 0; j < options.depth_single; ++j) {
    SingleStreamBlockImpl* block = single_blocks[j]->as<SingleStreamBlock>();
    auto call = [block, sublayer = sublayer_fn(*this, depth + j)](const Tensors& in) {
      return Tensors{block->forward(in[0], in[1], in[2], sublayer)};
    };
    x = (unit_runner ? unit_runner(depth + j, call, {x, vec, angles}) : call({x, vec, angles}))[0];
  }
  at::Tensor out = final_layer->forward(x.narrow(1, txt.size(1), img.size(1)), vec);  // image tokens only
  if (sequence_split.gather) out = sequence_split.gather(out);
  return out;
}

at::Tensor FluxImpl::forward(const at::Tensor& x, const at::Tensor& t, const Conditioning& cond) {
  TORCH_CHECK(x.dim() == 4 || x.dim() == 5, "Flux: x must be images [B, C, H, W] or clips [B, C, T, H, W], got ",
              x.sizes());
  const bool video = x.dim() == 5;
  const int64_t p = options.patch, pt = video ? options.patch_t : 1;
  const int64_t B = x.size(0), gt = video ? x.size(2) / pt : 1, h = x.size(-2) / p, w = x.size(-1) / p;
  TORCH_CHECK(!video || x.size(2) % pt == 0, "Flux: ", x.size(2), " frames are not a multiple of patch_t ", pt);
  const at::Tensor& txt = cond.at("txt");
  const at::Tensor txt_ids = at::zeros({B, txt.size(1), 3}, x.options().dtype(at::kFloat));
  const at::Tensor guidance = options.guidance_embed ? guidance_input(cond, B, x.options()) : at::Tensor();
  const at::Tensor tokens = video ? pack_video_latents(x, pt, p) : pack_latents(x, p);
  at::Tensor out =
      forward_tokens(tokens, video_ids(B, gt, h, w, x.options()), txt, txt_ids, t, cond.at("vec"), guidance);
  return video ? unpack_video_latents(out, options.in_channels, pt, p, gt, h, w)
               : unpack_latents(out, options.in_channels, p, h, w);
}

at::Tensor FluxImpl::guidance_input(const Conditioning& cond, int64_t batch, const at::TensorOptions& o) const {
  if (cond.has("guidance")) return cond.at("guidance");
  return at::full({batch}, guidance, o.dtype(at::kFloat));
}

std::vector<int64_t> FluxImpl::sample_shape() const {
  if (options.is_video()) return {options.in_channels, options.frames, options.input_size, options.input_size};
  return {options.in_channels, options.input_size, options.input_size};
}

std::string FluxImpl::token_layout() const {
  if (options.is_video())
    return fmt::format("model.frames {} / model.patch_t {} × (model.image_size {} / model.patch {})² video + "
                       "model.text_len {} text",
                       options.frames, options.patch_t, options.input_size, options.patch, options.text_len);
  return fmt::format("(model.image_size {} / model.patch {})² image + model.text_len {} text", options.input_size,
                     options.patch, options.text_len);
}

std::string FluxImpl::describe() const {
  // The model's inputs: pixels, or latents when the run encodes through an autoencoder.
  const std::string inputs = options.is_video()
                                  ? fmt::format("{}×{}×{}×{}", options.in_channels, options.frames, options.input_size,
                                                options.input_size)
                                  : fmt::format("{}×{}×{}", options.in_channels, options.input_size, options.input_size);
  return fmt::format("Flux {}+{} blocks hidden {} heads {} on {} inputs ({} {} + {} text tokens)", options.depth,
                     options.depth_single, options.hidden, options.heads, inputs, options.image_tokens(),
                     options.is_video() ? "video" : "image", options.text_len);
}

ConditioningDropout FluxImpl::conditioning_dropout() const {
  ConditioningDropout d;
  if (text_dropout > 0) d.probabilities = {text_dropout, text_dropout};
  d.apply = [](const Conditioning& cond, const std::vector<at::Tensor>& dropped) {
    if (dropped.empty()) return cond;
    Conditioning out = cond;
    size_t k = 0;
    for (const char* name : {"txt", "vec"}) {
      const at::Tensor& v = cond.at(name);
      std::vector<int64_t> shape(v.dim(), 1);
      shape[0] = v.size(0);
      out.set(name, at::where(dropped[k++].to(v.device()).reshape(shape), at::zeros_like(v), v));
    }
    return out;
  };
  return d;
}

Conditioning FluxImpl::null_conditioning(const Conditioning& cond) const {
  Conditioning out = cond;
  out.set("txt", at::zeros_like(cond.at("txt")));
  out.set("vec", at::zeros_like(cond.at("vec")));
  return out;
}

UnitPlan FluxImpl::units() const {
  UnitPlan plan;
  plan.stem = {"img_in", "time_in", "vector_in", "txt_in"};
  if (options.guidance_embed) plan.stem.push_back("guidance_in");
  for (int64_t i = 0; i < options.depth; ++i) plan.blocks.push_back(fmt::format("double_blocks.{}", i));
  for (int64_t j = 0; j < options.depth_single; ++j) plan.blocks.push_back(fmt::format("single_blocks.{}", j));
  plan.head = {"final_layer"};
  return plan;
}

void FluxImpl::set_attention(const AttentionFn& attention) {
  for (const auto& b : *double_blocks) b->as<DoubleStreamBlock>()->attention = attention;
  for (const auto& b : *single_blocks) b->as<SingleStreamBlock>()->attention = attention;
}

}  // namespace flowtrain::models
