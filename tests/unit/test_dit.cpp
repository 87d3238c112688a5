// DiT against independent float64 computations of the reference formulas
// (facebookresearch/DiT models.py) and the reference parameter names.
#include "models/dit/dit.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <array>
#include <cmath>
#include <set>

using namespace flowtrain::models;

namespace {

DiTOptions small_options() {
  DiTOptions o;
  o.input_size = 8;
  o.patch = 2;
  o.in_channels = 3;
  o.hidden = 32;
  o.depth = 2;
  o.heads = 4;
  o.num_classes = 5;
  o.learn_sigma = true;
  return o;
}

// Reference 1-D table, written from the formula with plain loops in double.
double ref_1d(int64_t dim, double pos, int64_t j) {
  const int64_t half = dim / 2;
  const int64_t k = j % half;
  const double omega = 1.0 / std::pow(10000.0, double(k) / double(half));
  return j < half ? std::sin(pos * omega) : std::cos(pos * omega);
}

}  // namespace

TEST(DiTMath, SinCosTableMatchesFloat64Formula) {
  const int64_t dim = 16, grid = 5;
  at::Tensor table = sincos_pos_embed_2d(dim, grid);
  ASSERT_EQ(table.sizes(), (std::vector<int64_t>{grid * grid, dim}));
  auto acc = table.accessor<float, 2>();
  for (int64_t row = 0; row < grid; ++row) {
    for (int64_t col = 0; col < grid; ++col) {
      const int64_t n = row * grid + col;
      for (int64_t j = 0; j < dim; ++j) {
        // first half encodes the column (meshgrid(w, h)[0]), second half the row
        const double expected = j < dim / 2 ? ref_1d(dim / 2, col, j) : ref_1d(dim / 2, row, j - dim / 2);
        // float32 rounding of values in [-1, 1]: |error| <= 2^-24 relative, 1e-6 is ample
        EXPECT_NEAR(acc[n][j], expected, 1e-6) << "token " << n << " channel " << j;
      }
    }
  }
}

TEST(DiTMath, TimestepFeaturesCosFirst) {
  at::Tensor t = at::tensor({0.0, 1.5, 250.0, 999.0}, at::kDouble);
  const int64_t dim = 256, half = 128;
  at::Tensor emb = timestep_features(t, dim);
  auto acc = emb.accessor<float, 2>();
  for (int64_t b = 0; b < 4; ++b) {
    const double tb = t[b].item<double>();
    for (int64_t k = 0; k < half; ++k) {
      // the reference computes freqs in float32: exp(-ln(1e4)·k/half); arguments up to ~1000
      // rad lose ~1000·2^-24 ≈ 6e-5 in float32, so compare to 2e-4
      const double f = std::exp(-std::log(10000.0) * double(k) / double(half));
      EXPECT_NEAR(acc[b][k], std::cos(tb * f), 2e-4);
      EXPECT_NEAR(acc[b][half + k], std::sin(tb * f), 2e-4);
    }
  }
}

TEST(DiTMath, UnpatchifyIsChannelLastPerToken) {
  DiTOptions o = small_options();  // grid 4, p 2, C_out 6
  DiT model(o);
  const int64_t p = o.patch, c_out = o.out_channels(), g = o.grid();
  // token (h, w) feature index (pi, qi, c) holds a code that names its destination
  at::Tensor tokens = at::empty({1, g * g, p * p * c_out});
  auto tok = tokens.accessor<float, 3>();
  for (int64_t h = 0; h < g; ++h)
    for (int64_t w = 0; w < g; ++w)
      for (int64_t pi = 0; pi < p; ++pi)
        for (int64_t qi = 0; qi < p; ++qi)
          for (int64_t c = 0; c < c_out; ++c)
            tok[0][h * g + w][(pi * p + qi) * c_out + c] = float(c * 10000 + (h * p + pi) * 100 + (w * p + qi));
  at::Tensor img = model->unpatchify(tokens);
  ASSERT_EQ(img.sizes(), (std::vector<int64_t>{1, c_out, g * p, g * p}));
  auto im = img.accessor<float, 4>();
  for (int64_t c = 0; c < c_out; ++c)
    for (int64_t y = 0; y < g * p; ++y)
      for (int64_t x = 0; x < g * p; ++x) ASSERT_EQ(im[0][c][y][x], float(c * 10000 + y * 100 + x));
}

TEST(DiTMath, BlockUsesReferenceModulationOrder) {
  at::manual_seed(0);
  const int64_t D = 16;
  DiTBlock block(D, 2, 4 * D, default_attention());
  // Drive the modulation through the bias only: chunks are (shift_msa, scale_msa, gate_msa,
  // shift_mlp, scale_mlp, gate_mlp), each a distinct constant vector.
  auto* lin = block->adaLN_modulation[1]->as<Linear>();
  at::NoGradGuard no_grad;
  lin->weight.zero_();
  at::Tensor chunks = at::randn({6, D});
  lin->bias.copy_(chunks.reshape({-1}));
  at::Tensor x = at::randn({2, 5, D}), c = at::randn({2, D});
  at::Tensor out = block->forward(x, c);

  auto norm = [](const at::Tensor& v) { return at::layer_norm(v, {v.size(-1)}, {}, {}, 1e-6); };
  at::Tensor h = x + chunks[2] * block->attn->forward(norm(x) * (1 + chunks[1]) + chunks[0]);
  at::Tensor expected = h + chunks[5] * block->mlp->forward(norm(h) * (1 + chunks[4]) + chunks[3]);
  // identical float32 operations up to broadcasting order: bitwise-close
  EXPECT_TRUE(at::allclose(out, expected, 1e-5, 1e-6));
}

namespace {

// Output and input gradients of f on float32 inputs, and of a reference on float64 copies.
struct Grads {
  at::Tensor out;
  std::vector<at::Tensor> grads;
};
template <typename F>
Grads run_with_grads(const F& f, const std::vector<at::Tensor>& inputs, const at::Tensor& weight) {
  std::vector<at::Tensor> leaves;
  for (const auto& t : inputs) leaves.push_back(t.detach().clone().set_requires_grad(true));
  at::Tensor out = f(leaves);
  at::Tensor loss = (out * weight.to(out.scalar_type())).sum();
  return {out.detach(), torch::autograd::grad({loss}, leaves)};
}

std::vector<at::Tensor> to_double(const std::vector<at::Tensor>& v) {
  std::vector<at::Tensor> out;
  for (const auto& t : v) out.push_back(t.to(at::kDouble));
  return out;
}

}  // namespace

// Attention in timm's layout: qkv output [B, N, 3, H, Dh], softmax(q·kᵀ/√Dh)·v per head, heads
// concatenated back to [B, N, H·Dh] before proj; written out in float64 with plain matmuls.
TEST(DiTMath, AttentionMatchesFloat64Heads) {
  at::manual_seed(5);
  const int64_t B = 2, N = 7, D = 24, H = 3, Dh = D / H;
  Attention attn(D, H, default_attention());
  at::Tensor x = at::randn({B, N, D}).set_requires_grad(true);
  at::Tensor out = attn->forward(x);
  at::Tensor wq = attn->qkv->weight.detach().to(at::kDouble), bq = attn->qkv->bias.detach().to(at::kDouble);
  at::Tensor wp = attn->proj->weight.detach().to(at::kDouble), bp = attn->proj->bias.detach().to(at::kDouble);
  at::Tensor x64 = x.detach().to(at::kDouble).requires_grad_(true);
  at::Tensor qkv = (at::matmul(x64, wq.t()) + bq).view({B, N, 3, H, Dh});
  std::vector<at::Tensor> heads;
  for (int64_t h = 0; h < H; ++h) {
    at::Tensor q = qkv.select(2, 0).select(2, h), k = qkv.select(2, 1).select(2, h), v = qkv.select(2, 2).select(2, h);
    heads.push_back(at::matmul(at::softmax(at::matmul(q, k.transpose(1, 2)) / std::sqrt(double(Dh)), -1), v));
  }
  at::Tensor ref = at::matmul(at::cat(heads, -1), wp.t()) + bp;
  EXPECT_TRUE(at::allclose(out.detach().to(at::kDouble), ref, 1e-5, 1e-6));
  at::Tensor w = at::randn({B, N, D});
  at::Tensor gx = torch::autograd::grad({(out * w).sum()}, {x})[0];
  at::Tensor gx64 = torch::autograd::grad({(ref * w.to(at::kDouble)).sum()}, {x64})[0];
  EXPECT_TRUE(at::allclose(gx.to(at::kDouble), gx64, 1e-5, 1e-6));
}

// default_attention's two implementations (the explicit-GEMM composition for short fp32 CPU
// sequences, ATen's SDPA above kMathAttentionMaxTokens) against softmax(q·kᵀ/√Dh)·v in float64,
// values and input gradients. Tolerance: fp32 rounding of O(1) scores through Dh- and N-term
// sums (N ≤ 131), well under 1e-5.
TEST(DiTMath, DefaultAttentionMatchesFloat64OnBothSidesOfTheMathThreshold) {
  at::manual_seed(8);
  for (int64_t N : {int64_t{9}, kMathAttentionMaxTokens, kMathAttentionMaxTokens + 3}) {
    std::vector<at::Tensor> qkv;
    for (int i = 0; i < 3; ++i) qkv.push_back(at::randn({2, 3, N, 16}));
    const at::Tensor w = at::randn({2, 3, N, 16});
    auto f = [](const std::vector<at::Tensor>& in) { return default_attention()(in[0], in[1], in[2]); };
    Grads got = run_with_grads(f, qkv, w);
    auto ref_f = [](const std::vector<at::Tensor>& in) {
      at::Tensor scores = at::matmul(in[0], in[1].transpose(-2, -1)) / std::sqrt(16.0);
      return at::matmul(at::softmax(scores, -1), in[2]);
    };
    Grads ref = run_with_grads(ref_f, to_double(qkv), w);
    EXPECT_TRUE(at::allclose(got.out.to(at::kDouble), ref.out, 1e-5, 1e-6)) << "N " << N;
    for (size_t i = 0; i < 3; ++i)
      EXPECT_TRUE(at::allclose(got.grads[i].to(at::kDouble), ref.grads[i], 1e-5, 1e-6)) << "N " << N << " input " << i;
  }
}

TEST(DiTMath, DefaultAttentionIsRecognisedAndInjectedOnesAreNot) {
  EXPECT_TRUE(is_default_attention(default_attention()));
  AttentionFn custom = [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return at::scaled_dot_product_attention(q, k, v);
  };
  EXPECT_FALSE(is_default_attention(custom));
  EXPECT_FALSE(is_default_attention(AttentionFn()));
}

// Tokens come out token-major and contiguous (a transposed view would make every later
// LayerNorm and linear copy its input), in row-major patch order.
TEST(DiTMath, PatchEmbedTokensAreContiguousRowMajor) {
  PatchEmbed embed(2, 6, 2);
  at::Tensor x = at::randn({3, 2, 8, 8});
  at::Tensor tokens = embed->forward(x);
  EXPECT_TRUE(tokens.is_contiguous());
  EXPECT_EQ(tokens.sizes(), (std::vector<int64_t>{3, 16, 6}));
  at::Tensor conv = embed->proj->forward(x);  // [3, 6, 4, 4]
  EXPECT_TRUE(at::equal(tokens.select(1, 1 * 4 + 2), conv.select(2, 1).select(2, 2)));  // row 1, col 2
}

TEST(DiTInit, AdaLNZeroAndFinalLayerAreZeroSoOutputIsZero) {
  at::manual_seed(1);
  DiT model(small_options());
  for (const auto& block : *model->blocks) {
    auto* last = block->as<DiTBlock>()->adaLN_modulation[1]->as<Linear>();
    EXPECT_EQ(last->weight.abs().max().item<float>(), 0.f);
    EXPECT_EQ(last->bias.abs().max().item<float>(), 0.f);
  }
  EXPECT_EQ(model->final_layer->linear->weight.abs().max().item<float>(), 0.f);
  EXPECT_EQ(model->final_layer->adaLN_modulation[1]->as<Linear>()->weight.abs().max().item<float>(), 0.f);
  // Embedders are normal(0, 0.02): the sample std of 6·32 and 256·32 values is within 25%.
  const float y_std = model->y_embedder->embedding_table->weight.std().item<float>();
  EXPECT_NEAR(y_std, 0.02, 0.005);
  EXPECT_FALSE(model->pos_embed.requires_grad());
  at::Tensor out = model->forward(at::randn({2, 3, 8, 8}), at::tensor({0.3f, 0.9f}), at::tensor({int64_t{1}, int64_t{5}}));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 6, 8, 8}));
  EXPECT_EQ(out.abs().max().item<float>(), 0.f);
  // Xavier-uniform linears: bound sqrt(6/(fan_in+fan_out)) is respected and reached closely.
  auto w = model->blocks[0]->as<DiTBlock>()->attn->qkv->weight;
  const double bound = std::sqrt(6.0 / (32 + 96));
  EXPECT_LE(w.abs().max().item<float>(), bound + 1e-7);
  EXPECT_GT(w.abs().max().item<float>(), 0.9 * bound);
}

TEST(DiTNames, StateDictKeysEqualReferenceCheckpoint) {
  DiTOptions o = small_options();
  o.depth = 1;
  DiT model(o);
  std::vector<std::string> names;
  for (const auto& p : model->named_parameters()) names.push_back(p.key());
  // facebookresearch/DiT DiT-XL-2-256x256.pt key order for one block
  const std::vector<std::string> reference = {
      "x_embedder.proj.weight", "x_embedder.proj.bias",
      "t_embedder.mlp.0.weight", "t_embedder.mlp.0.bias", "t_embedder.mlp.2.weight", "t_embedder.mlp.2.bias",
      "y_embedder.embedding_table.weight", "pos_embed",
      "blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias", "blocks.0.attn.proj.weight", "blocks.0.attn.proj.bias",
      "blocks.0.mlp.fc1.weight", "blocks.0.mlp.fc1.bias", "blocks.0.mlp.fc2.weight", "blocks.0.mlp.fc2.bias",
      "blocks.0.adaLN_modulation.1.weight", "blocks.0.adaLN_modulation.1.bias",
      "final_layer.linear.weight", "final_layer.linear.bias",
      "final_layer.adaLN_modulation.1.weight", "final_layer.adaLN_modulation.1.bias"};
  // The reference registers pos_embed before the embedders; only the set and shapes matter to
  // load_state_dict, so compare as sets and check the shapes of the ones that carry layout.
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), std::set<std::string>(reference.begin(), reference.end()));
  auto params = model->named_parameters();
  EXPECT_EQ(params["x_embedder.proj.weight"].sizes(), (std::vector<int64_t>{32, 3, 2, 2}));
  EXPECT_EQ(params["y_embedder.embedding_table.weight"].sizes(), (std::vector<int64_t>{6, 32}));
  EXPECT_EQ(params["pos_embed"].sizes(), (std::vector<int64_t>{1, 16, 32}));
  EXPECT_EQ(params["final_layer.linear.weight"].sizes(), (std::vector<int64_t>{2 * 2 * 6, 32}));
}

TEST(DiTNames, XL2HasReferenceParameterCount) {
  // DiT-XL/2, 256px (32×32×4 latents), 1000 classes, learn_sigma: 675,129,632 parameters
  // (pos_embed included), the paper's "675M" and the count of the released checkpoint.
  DiTOptions o = dit_size("XL");
  o.input_size = 32;
  o.patch = 2;
  o.in_channels = 4;
  o.num_classes = 1000;
  o.learn_sigma = true;
  DiT model(o);
  EXPECT_EQ(count_parameters(*model), 675129632);
  // The memory estimate's per-unit counts add up to the same (pos_embed as the stem's fixed part).
  int64_t units = 0;
  for (const auto& u : dit_unit_footprints(o, /*cpu_fp32=*/false)) units += u.parameters + u.fixed;
  EXPECT_EQ(units, 675129632);
  // FLOPs: the paper's 118.6 GMACs are 237 GFLOP forward, 712 per training image (±0.5%;
  // docs/design/models.md, "FLOPs").
  EXPECT_NEAR(dit_forward_flops_per_sample(o) / 1e9, 237.0, 1.2);
  EXPECT_NEAR(dit_train_flops_per_sample(o) / 1e9, 712.0, 3.6);
}

TEST(DiTNames, SizeTable) {
  EXPECT_EQ(dit_size("S").hidden, 384);
  EXPECT_EQ(dit_size("B").heads, 12);
  EXPECT_EQ(dit_size("L").depth, 24);
  EXPECT_THROW(dit_size("M"), std::invalid_argument);
}
