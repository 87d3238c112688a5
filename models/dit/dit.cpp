#include "models/dit/dit.h"

#include "models/kernels/cpu_fused.h"

#include <torch/nn/init.h>
#include <torch/nn/modules/activation.h>

#include <fmt/format.h>

#include <stdexcept>

namespace flowtrain::models {

namespace {
struct Size {
  const char* name;
  int64_t depth, hidden, heads;
};
constexpr Size kSizes[] = {
    {"tiny", 4, 128, 4}, {"S", 12, 384, 6}, {"B", 12, 768, 12}, {"L", 24, 1024, 16}, {"XL", 28, 1152, 16}};
}  // namespace

std::vector<std::string> dit_size_names() {
  std::vector<std::string> names;
  for (const Size& s : kSizes) names.emplace_back(s.name);
  return names;
}

DiTOptions dit_size(const std::string& name, DiTOptions base) {
  for (const Size& s : kSizes) {
    if (name == s.name) {
      base.depth = s.depth;
      base.hidden = s.hidden;
      base.heads = s.heads;
      return base;
    }
  }
  throw std::invalid_argument("unknown DiT size '" + name + "' (expected tiny|S|B|L|XL)");
}

// ---- block -------------------------------------------------------------------------------

DiTBlockImpl::DiTBlockImpl(int64_t hidden, int64_t heads, int64_t mlp_hidden, AttentionFn attention) {
  attn = register_module("attn", Attention(hidden, heads, std::move(attention)));
  mlp = register_module("mlp", Mlp(hidden, mlp_hidden));
  adaLN_modulation = register_module(
      "adaLN_modulation", torch::nn::Sequential(torch::nn::SiLU(), Linear(hidden, 6 * hidden)));
}

at::Tensor DiTBlockImpl::forward(const at::Tensor& x, const at::Tensor& c, const SublayerFn& sublayer) {
  // Reference chunk order: shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp.
  auto mod = adaLN_modulation->forward(c).chunk(6, /*dim=*/1);
  const at::Tensor &shift_msa = mod[0], &scale_msa = mod[1], &gate_msa = mod[2];
  const at::Tensor &shift_mlp = mod[3], &scale_mlp = mod[4], &gate_mlp = mod[5];
  // x + gate·attn(modulate(norm1(x), shift, scale)), then the same with the MLP (fused CPU kernels).
  const UnitCall attention_branch = [this](const Tensors& in) {
    return Tensors{attn->forward(adaln_modulate(in[0], in[1], in[2]))};
  };
  const UnitCall mlp_branch = [this](const Tensors& in) {
    return Tensors{mlp->forward(adaln_modulate(in[0], in[1], in[2]))};
  };
  at::Tensor h = gated_residual(
      x, gate_msa, run_sublayer(sublayer, Sublayer::Attention, attention_branch, {x, shift_msa, scale_msa})[0]);
  return gated_residual(h, gate_mlp,
                        run_sublayer(sublayer, Sublayer::Mlp, mlp_branch, {h, shift_mlp, scale_mlp})[0]);
}

// ---- final layer -------------------------------------------------------------------------

FinalLayerImpl::FinalLayerImpl(int64_t hidden, int64_t patch, int64_t out_channels) {
  linear = register_module("linear", Linear(hidden, patch * patch * out_channels));
  adaLN_modulation = register_module(
      "adaLN_modulation", torch::nn::Sequential(torch::nn::SiLU(), Linear(hidden, 2 * hidden)));
}

at::Tensor FinalLayerImpl::forward(const at::Tensor& x, const at::Tensor& c) {
  auto mod = adaLN_modulation->forward(c).chunk(2, /*dim=*/1);  // shift, scale
  return linear(adaln_modulate(x, mod[0], mod[1]));  // modulate(norm_final(x), shift, scale)
}

// ---- model -------------------------------------------------------------------------------

DiTImpl::DiTImpl(const DiTOptions& o, AttentionFn attention) : options(o) {
  TORCH_CHECK(o.input_size % o.patch == 0, "DiT: input_size ", o.input_size, " not divisible by patch ", o.patch);
  TORCH_CHECK(o.hidden % o.heads == 0, "DiT: hidden ", o.hidden, " not divisible by heads ", o.heads);
  // Registration order = the reference's state_dict order.
  x_embedder = register_module("x_embedder", PatchEmbed(o.in_channels, o.hidden, o.patch));
  t_embedder = register_module("t_embedder", TimestepEmbedder(o.hidden));
  y_embedder = register_module("y_embedder", LabelEmbedder(o.num_classes, o.hidden));
  pos_embed = register_parameter("pos_embed", at::zeros({1, o.num_tokens(), o.hidden}), /*requires_grad=*/false);
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.depth; ++i) blocks->push_back(DiTBlock(o.hidden, o.heads, o.mlp_hidden(), attention));
  final_layer = register_module("final_layer", FinalLayer(o.hidden, o.patch, o.out_channels()));
  initialize_weights();
}

void DiTImpl::initialize_weights() {
  namespace init = torch::nn::init;
  at::NoGradGuard no_grad;
  // 1. xavier_uniform on every Linear, zero biases (the reference's _basic_init, module order).
  xavier_init_linears(*this);
  // 2. Fixed sin-cos position table.
  pos_embed.copy_(sincos_pos_embed_2d(options.hidden, options.grid()).unsqueeze(0));
  // 3. Patch embedding like a Linear: xavier on the weight viewed as [D, C·p·p].
  at::Tensor w = x_embedder->proj->weight;
  init::xavier_uniform_(w.view({w.size(0), -1}));
  init::zeros_(x_embedder->proj->bias);
  // 4. Embedders: normal(0, 0.02).
  init::normal_(y_embedder->embedding_table->weight, 0.0, 0.02);
  for (int idx : {0, 2}) init::normal_(t_embedder->mlp[idx]->as<Linear>()->weight, 0.0, 0.02);
  // 5. adaLN-Zero: every block's modulation and the final layer output start at zero, so each
  //    block is the identity and the model outputs 0 at initialisation.
  for (const auto& block : *blocks) {
    auto* last = block->as<DiTBlock>()->adaLN_modulation[1]->as<Linear>();
    init::zeros_(last->weight);
    init::zeros_(last->bias);
  }
  auto* final_mod = final_layer->adaLN_modulation[1]->as<Linear>();
  init::zeros_(final_mod->weight);
  init::zeros_(final_mod->bias);
  init::zeros_(final_layer->linear->weight);
  init::zeros_(final_layer->linear->bias);
}

at::Tensor DiTImpl::unpatchify(const at::Tensor& tokens) const {
  const int64_t c = options.out_channels(), p = options.patch, h = options.grid(), w = options.grid();
  TORCH_CHECK(tokens.size(1) == h * w, "unpatchify: expected ", h * w, " tokens, got ", tokens.size(1));
  // [B, h·w, p·p·c] -> [B, h, w, p, q, c] -> "nhwpqc -> nchpwq" -> [B, c, h·p, w·p]
  at::Tensor x = tokens.reshape({tokens.size(0), h, w, p, p, c});
  x = x.permute({0, 5, 1, 3, 2, 4});
  return x.reshape({tokens.size(0), c, h * p, w * p});
}

at::Tensor DiTImpl::forward(const at::Tensor& x, const at::Tensor& t, const at::Tensor& y) {
  at::Tensor tokens = x_embedder->forward(x) + pos_embed;                 // [B, T, D]
  if (sequence_split.split) tokens = sequence_split.split(tokens);       // [B, T/cp, D]
  at::Tensor c = t_embedder->forward(t * options.timestep_scale) + y_embedder->forward(y);  // [B, D]
  for (int64_t i = 0; i < options.depth; ++i) {
    DiTBlockImpl* block = blocks[i]->as<DiTBlock>();
    if (!unit_runner) {
      tokens = block->forward(tokens, c, sublayer_fn(*this, i));
      continue;
    }
    tokens = unit_runner(
        i, [block, sublayer = sublayer_fn(*this, i)](const Tensors& in) { return Tensors{block->forward(in[0], in[1], sublayer)}; },
        {tokens, c})[0];
  }
  at::Tensor out = final_layer->forward(tokens, c);                       // [B, T, p²·C_out]
  if (sequence_split.gather) out = sequence_split.gather(out);
  return unpatchify(out);                                                 // [B, C_out, H, W]
}

at::Tensor DiTImpl::forward(const at::Tensor& x, const at::Tensor& t, const Conditioning& cond) {
  return forward(x, t, cond.at("labels"));
}

std::vector<int64_t> DiTImpl::sample_shape() const {
  return {options.in_channels, options.input_size, options.input_size};
}

std::string DiTImpl::token_layout() const {
  return fmt::format("(model.image_size {} / model.patch {})²", options.input_size, options.patch);
}

double DiTImpl::train_flops_per_sample() const { return dit_train_flops_per_sample(options); }

std::string DiTImpl::describe() const {
  return fmt::format("DiT depth {} hidden {} heads {} patch {} on {}×{}×{} ({} tokens)", options.depth,
                     options.hidden, options.heads, options.patch, options.in_channels, options.input_size,
                     options.input_size, options.num_tokens());
}

ConditioningDropout DiTImpl::conditioning_dropout() const {
  ConditioningDropout d;
  if (class_dropout > 0) d.probabilities = {class_dropout};
  d.apply = [null_class = options.num_classes](const Conditioning& cond, const std::vector<at::Tensor>& dropped) {
    if (dropped.empty()) return cond;
    Conditioning out = cond;
    const at::Tensor& labels = cond.at("labels");
    out.set("labels", at::where(dropped[0].to(labels.device()), at::full_like(labels, null_class), labels));
    return out;
  };
  return d;
}

Conditioning DiTImpl::null_conditioning(const Conditioning& cond) const {
  return {{"labels", at::full_like(cond.at("labels"), options.num_classes)}};
}

UnitPlan DiTImpl::units() const {
  UnitPlan plan;
  plan.stem = {"x_embedder", "t_embedder", "y_embedder"};  // pos_embed is fixed: not sharded
  for (int64_t i = 0; i < options.depth; ++i) plan.blocks.push_back(fmt::format("blocks.{}", i));
  plan.head = {"final_layer"};
  return plan;
}

void DiTImpl::set_attention(const AttentionFn& attention) {
  for (const auto& block : *blocks) block->as<DiTBlock>()->attn->attention = attention;
}

double dit_forward_flops_per_sample(const DiTOptions& o) {
  const double T = static_cast<double>(o.num_tokens()), D = static_cast<double>(o.hidden);
  const double mlp = static_cast<double>(o.mlp_hidden()), patch_in = double(o.in_channels) * o.patch * o.patch;
  const double per_token_block = 2.0 * (3 * D * D + D * D + 2 * D * mlp) + 4.0 * T * D;
  const double per_sample_block = 2.0 * D * 6 * D;  // adaLN modulation linear
  double flops = o.depth * (T * per_token_block + per_sample_block);
  flops += T * 2.0 * patch_in * D;                                              // patch embedding
  flops += T * 2.0 * D * (o.patch * o.patch * o.out_channels()) + 2.0 * D * 2 * D;  // final layer
  flops += 2.0 * (256 * D + D * D);                                             // timestep MLP
  return flops;
}

std::vector<UnitFootprint> dit_unit_footprints(const DiTOptions& o, bool cpu_fp32) {
  const int64_t D = o.hidden, M = o.mlp_hidden(), H = o.heads, C = o.in_channels, p = o.patch;
  const double T = double(o.num_tokens());
  auto linear = [](int64_t in, int64_t out) { return in * out + out; };
  // What the attention keeps besides the modulated input and qkv: the fused CPU kernel (short
  // fp32 sequences) the probabilities and its [T, D] output (proj's input); the math path the
  // probabilities, the scaled q and the [T, D] copy of its output; SDPA its output, the
  // log-sum-exp and the copy.
  const bool fused = cpu_fp32 && o.num_tokens() <= cpu_fused::kQkvAttentionMaxTokens;
  const bool math = default_attention_saves(cpu_fp32, o.num_tokens()) == AttentionSaves::Probabilities;
  const double kept_by_attention = fused ? H * T * T + T * D : math ? H * T * T + 2 * T * D : 2 * T * D + H * T;
  std::vector<UnitFootprint> units;

  // Stem: the patch embedding keeps the input image, the timestep MLP its 256 features and SiLU.
  UnitFootprint stem{"stem"};
  stem.parameters = (C * p * p * D + D) + linear(256, D) + linear(D, D) + (o.num_classes + 1) * D;
  stem.fixed = o.num_tokens() * D;  // pos_embed
  stem.saved = double(C) * o.input_size * o.input_size + 256 + 2 * D;
  units.push_back(stem);

  // A block, per token: its input (kept by the first LayerNorm); in the attention sublayer the
  // modulated input (1), qkv (3) and what the kernel keeps; proj's output kept by the gated
  // residual (1); the residual stream (1); in the MLP sublayer the modulated input (1), the
  // GELU's input and output (2·M/D); fc2's output kept by its gated residual (1). Per sample:
  // the 6 modulation chunks and SiLU(c).
  for (int64_t i = 0; i < o.depth; ++i) {
    UnitFootprint b{fmt::format("blocks.{}", i)};
    b.parameters = linear(D, 6 * D) + linear(D, 3 * D) + linear(D, D) + linear(D, M) + linear(M, D);
    b.input = T * D + D;
    b.attention = T * (4 * D) + kept_by_attention;
    b.mlp = T * (D + 2 * M);
    b.saved = b.input + b.attention + b.mlp + T * (3 * D) + 7 * D;
    b.backward_working = T * (3 * D + M) + (fused || math ? 2 * H * T * T : 0);
    units.push_back(b);
  }

  // Head: the final layer's input and modulated input, its output; the objective keeps the
  // prediction, target and their difference.
  UnitFootprint head{"head"};
  head.parameters = linear(D, 2 * D) + linear(D, p * p * o.out_channels());
  head.saved = 2 * T * D + T * p * p * o.out_channels() + 3.0 * C * o.input_size * o.input_size + 3 * D;
  units.push_back(head);
  return units;
}

}  // namespace flowtrain::models
