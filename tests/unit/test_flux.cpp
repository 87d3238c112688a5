// FLUX.1 (models/flux/) against the reference implementation's own output, and its parts against
// float64 formulas: RoPE on interleaved pairs, QK RMSNorm, the modulation chunks of both block
// types, the 2×2 latent packing; the parameter counts of flux-dev / flux-schnell.
#include "models/flux/flux.h"
#include "models/flux/rope.h"
#include "rope_reference.h"
#include "test_util.h"
#include "trainer/checkpoint/state_dict.h"

#include "data/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace flowtrain;
using namespace flowtrain::models;

namespace {

// The tiny model of tests/data/make_flux_reference.py (guidance embedding on).
FluxOptions reference_options() {
  FluxOptions o = flux_size("flux-tiny");
  o.in_channels = 16;  // 16 × 2 × 2 = 64 token features, as FLUX.1
  o.patch = 2;
  o.depth = 1;
  o.depth_single = 2;
  o.guidance_embed = true;
  o.input_size = 8;
  o.text_len = 5;
  return o;
}

double max_abs(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

}  // namespace

TEST(Flux, ForwardEqualsTheReferenceImplementationsOutput) {
  // tests/data/flux_reference_tiny.safetensors: weights, inputs and output of
  // black-forest-labs/flux's own Flux.forward (tests/data/make_flux_reference.py).
  const auto file = data::read_safetensors(test::source_path("tests/data/flux_reference_tiny.safetensors"));
  std::map<std::string, at::Tensor> t;
  trainer::NamedTensors weights;
  for (const auto& [name, tensor] : file) {
    if (name.rfind("model.", 0) == 0) weights.emplace_back(name.substr(6), tensor);
    else t[name] = tensor;
  }
  Flux model(reference_options());
  // Strict: every reference key present with its shape, none extra (the names are the checkpoints').
  trainer::load_state_dict(*model, weights, "flux_reference_tiny.safetensors");
  model->eval();
  at::NoGradGuard no_grad;
  const at::Tensor out = model->forward_tokens(t.at("img"), t.at("img_ids"), t.at("txt"), t.at("txt_ids"),
                                               t.at("timesteps"), t.at("y"), t.at("guidance"));
  ASSERT_EQ(out.sizes(), t.at("out").sizes());
  // Both fp32 on the CPU, through other kernels (fused adaLN / gated residual / GELU here, PyTorch's
  // composite ops there) and summation orders: ~1e-6 relative per op, a few ulps through 3 blocks.
  // |out| is ~0.8 (max 3.7); a swapped chunk, a RoPE sign or text/image order error moves it by
  // O(0.1). Measured: 1.2e-6 on an AMD EPYC CI host, 3.4e-5 on an Intel Xeon one (other CPU
  // kernels; not yet traced to one op): 1e-4 passes both and stays 1,000× below a real error.
  const double diff = max_abs(out, t.at("out"));
  std::printf("[flux] max |ours − reference| = %.3g (|reference| max %.3g)\n", diff,
              t.at("out").abs().max().item<double>());
  EXPECT_LT(diff, 1e-4);

  // The image-space entry point packs the same tokens: unpack(reference) from latents.
  const int64_t h = 4, w = 3;
  const at::Tensor latents = unpack_latents(t.at("img"), 16, 2, h, w);
  const Conditioning cond{{"txt", t.at("txt")}, {"vec", t.at("y")}, {"guidance", t.at("guidance")}};
  const at::Tensor v = model->forward(latents, t.at("timesteps"), cond);
  EXPECT_LT(max_abs(v, unpack_latents(t.at("out"), 16, 2, h, w)), 1e-4);  // as above
}

TEST(Flux, AGuidanceDistilledModelTrainsAtTheConfiguredGuidanceWhenTheBatchCarriesNone) {
  // FLUX.1-dev's guidance_in reads g; training batches carry no "guidance", so the model feeds
  // its configured value to every row: the same output as a batch carrying that g, another output
  // than a batch carrying another g (so the embedding is really used).
  at::manual_seed(0);
  Flux model(reference_options());
  for (auto& p : model->parameters()) p.data().normal_(0, 0.05);  // no zero-initialised embedder or modulation
  model->guidance = 2.5;
  at::NoGradGuard no_grad;
  const at::Tensor x = at::randn({3, 16, 8, 8}), t = at::rand({3});
  Conditioning cond{{"txt", at::randn({3, 5, 32})}, {"vec", at::randn({3, 16})}};  // flux-tiny widths
  const at::Tensor v = model->forward(x, t, cond);
  Conditioning with = cond;
  with.set("guidance", at::full({3}, 2.5));
  EXPECT_TRUE(at::equal(v, model->forward(x, t, with)));
  with.set("guidance", at::full({3}, 1.0));
  EXPECT_GT(max_abs(v, model->forward(x, t, with)), 1e-3);
}

TEST(Flux, RopeRotatesInterleavedPairsByAxisFrequencies) {
  at::manual_seed(3);
  const std::vector<int64_t> axes = {4, 6, 6};
  const double theta = 10000.0;
  const int64_t B = 2, H = 3, L = 7, Dh = 16;
  const at::Tensor x = at::randn({B, H, L, Dh}, at::kDouble);
  const at::Tensor ids = at::randint(0, 20, {B, L, 3}).to(at::kFloat);
  const at::Tensor got = apply_rope(x.to(at::kFloat), rope_angles(ids, axes, theta));
  const at::Tensor want = test::rope_float64(x, ids, axes, theta);
  // fp32: angles up to 19 rad carry ~19 · 2^-24 ≈ 1.1e-6 error, times |x| ≤ ~4, plus rounding.
  EXPECT_LT(max_abs(got, want), 2e-5);
  // Text ids (0, 0, 0) are the identity.
  const at::Tensor zero_ids = at::zeros({B, L, 3});
  EXPECT_LT(max_abs(apply_rope(x.to(at::kFloat), rope_angles(zero_ids, axes, theta)), x), 1e-6);
}

TEST(Flux, QkRmsNormInFp32WithLearnableScale) {
  QkNorm norm(8);
  at::NoGradGuard no_grad;
  norm->query_norm->scale.copy_(at::linspace(0.5, 1.5, 8));
  const at::Tensor q = at::randn({2, 3, 4, 8}, at::kDouble) * 3, k = at::randn({2, 3, 4, 8}, at::kDouble);
  const at::Tensor v = at::zeros({1}, at::kFloat);
  auto [qn, kn] = norm->forward(q.to(at::kFloat), k.to(at::kFloat), v);
  const at::Tensor want_q = q * at::rsqrt(q.pow(2).mean(-1, true) + 1e-6) * at::linspace(0.5, 1.5, 8, at::kDouble);
  const at::Tensor want_k = k * at::rsqrt(k.pow(2).mean(-1, true) + 1e-6);
  EXPECT_EQ(qn.scalar_type(), at::kFloat);  // v's dtype
  EXPECT_LT(max_abs(qn, want_q), 1e-5);       // fp32 of O(1) values
  EXPECT_LT(max_abs(kn, want_k), 1e-5);
}

namespace {

// float64 reference of the two block types, written from the FLUX.1 equations (not from our
// modules' code): modulation chunks (shift, scale, gate[, shift, scale, gate]), LayerNorm without
// affine (eps 1e-6), QK RMSNorm, RoPE, joint attention text-first, GELU(tanh).
at::Tensor ln(const at::Tensor& x) { return at::layer_norm(x, {x.size(-1)}, {}, {}, 1e-6); }
at::Tensor mod(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  return (1 + scale.unsqueeze(1)) * ln(x) + shift.unsqueeze(1);
}
at::Tensor rms(const at::Tensor& x, const at::Tensor& scale) {
  return x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6) * scale;
}
at::Tensor lin(LinearImpl& l, const at::Tensor& x) { return at::linear(x, l.weight, l.bias); }
at::Tensor heads_of(const at::Tensor& x, int64_t H) {  // [B, L, D] -> [B, H, L, Dh]
  return x.reshape({x.size(0), x.size(1), H, -1}).transpose(1, 2);
}
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {  // [B, H, L, Dh] -> [B, L, D]
  at::Tensor p = at::softmax(at::matmul(q, k.transpose(-1, -2)) / std::sqrt(double(q.size(-1))), -1);
  at::Tensor o = at::matmul(p, v);
  return o.transpose(1, 2).reshape({o.size(0), o.size(2), -1});
}
at::Tensor rotate(const at::Tensor& x, const at::Tensor& angles) {  // float64 RoPE
  at::Tensor xp = x.reshape({x.size(0), x.size(1), x.size(2), -1, 2});
  at::Tensor c = angles.select(-1, 0).unsqueeze(1).to(at::kDouble), s = angles.select(-1, 1).unsqueeze(1).to(at::kDouble);
  return at::stack({c * xp.select(-1, 0) - s * xp.select(-1, 1), s * xp.select(-1, 0) + c * xp.select(-1, 1)}, -1)
      .reshape(x.sizes());
}

}  // namespace

TEST(Flux, BothBlockTypesFollowTheReferenceEquationsInFloat64) {
  at::manual_seed(11);
  FluxOptions o = reference_options();
  Flux model(o);
  model->to(at::kDouble);
  {
    at::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.normal_(0, 0.2);  // every modulation chunk non-zero
  }
  const int64_t B = 2, Li = 6, Lt = 3, D = o.hidden, H = o.heads;
  const at::Tensor img = at::randn({B, Li, D}, at::kDouble), txt = at::randn({B, Lt, D}, at::kDouble);
  const at::Tensor vec = at::randn({B, D}, at::kDouble);
  const at::Tensor ids = at::cat({at::zeros({B, Lt, 3}), image_ids(B, 2, 3, at::TensorOptions())}, 1);
  const at::Tensor angles = rope_angles(ids, o.axes_dim, o.theta);
  at::NoGradGuard no_grad;

  auto* block = model->double_blocks[0]->as<DoubleStreamBlock>();
  const Tensors got = block->forward(img, txt, vec, angles);
  // reference
  auto chunks = [&](LinearImpl& l, int64_t n) { return lin(l, at::silu(vec)).chunk(n, 1); };
  const auto im = chunks(*block->img_mod->lin, 6), tm = chunks(*block->txt_mod->lin, 6);
  auto qkv = [&](FluxSelfAttentionImpl& a, const at::Tensor& x) {
    auto parts = lin(*a.qkv, x).chunk(3, -1);  // (K H D): q, k, v each [B, L, D]
    return std::vector<at::Tensor>{rms(heads_of(parts[0], H), a.norm->query_norm->scale),
                                   rms(heads_of(parts[1], H), a.norm->key_norm->scale), heads_of(parts[2], H)};
  };
  const auto iq = qkv(*block->img_attn, mod(img, im[0], im[1]));
  const auto tq = qkv(*block->txt_attn, mod(txt, tm[0], tm[1]));
  const at::Tensor a = attend(rotate(at::cat({tq[0], iq[0]}, 2), angles), rotate(at::cat({tq[1], iq[1]}, 2), angles),
                              at::cat({tq[2], iq[2]}, 2));
  auto mlp = [&](torch::nn::Sequential& m, const at::Tensor& x) {
    return lin(*m[2]->as<Linear>(), at::gelu(lin(*m[0]->as<Linear>(), x), "tanh"));
  };
  at::Tensor i = img + im[2].unsqueeze(1) * lin(*block->img_attn->proj, a.narrow(1, Lt, Li));
  i = i + im[5].unsqueeze(1) * mlp(block->img_mlp, mod(i, im[3], im[4]));
  at::Tensor t = txt + tm[2].unsqueeze(1) * lin(*block->txt_attn->proj, a.narrow(1, 0, Lt));
  t = t + tm[5].unsqueeze(1) * mlp(block->txt_mlp, mod(t, tm[3], tm[4]));
  // float64 throughout (the fp32 RoPE angles are shared by both sides): ulps of float64.
  EXPECT_LT(max_abs(got[0], i), 1e-10);
  EXPECT_LT(max_abs(got[1], t), 1e-10);

  auto* single = model->single_blocks[0]->as<SingleStreamBlock>();
  const at::Tensor x = at::cat({txt, img}, 1);
  const at::Tensor got_single = single->forward(x, vec, angles);
  const auto sm = chunks(*single->modulation->lin, 3);  // shift, scale, gate
  const at::Tensor h1 = lin(*single->linear1, mod(x, sm[0], sm[1]));
  auto parts = h1.narrow(2, 0, 3 * D).chunk(3, -1);
  const at::Tensor att = attend(rotate(rms(heads_of(parts[0], H), single->norm->query_norm->scale), angles),
                                rotate(rms(heads_of(parts[1], H), single->norm->key_norm->scale), angles),
                                heads_of(parts[2], H));
  const at::Tensor want_single =
      x + sm[2].unsqueeze(1) * lin(*single->linear2, at::cat({att, at::gelu(h1.narrow(2, 3 * D, o.mlp_hidden()), "tanh")}, 2));
  EXPECT_LT(max_abs(got_single, want_single), 1e-10);
}

TEST(Flux, PackingIsRowMajorTwoByTwoWithChannelsOutermost) {
  const at::Tensor x = at::arange(2 * 3 * 4 * 6, at::kFloat).reshape({2, 3, 4, 6});
  const at::Tensor tokens = pack_latents(x, 2);  // [2, (4/2)·(6/2) = 6, 3·4 = 12]
  ASSERT_EQ(tokens.sizes(), at::IntArrayRef({2, 6, 12}));
  // token (row 1, col 2) = index 1·3 + 2 = 5 holds x[:, c, 2..3, 4..5] in (c, ph, pw) order.
  const at::Tensor want = x.narrow(2, 2, 2).narrow(3, 4, 2).reshape({2, 12});
  EXPECT_TRUE(at::equal(tokens.select(1, 5), want));
  EXPECT_TRUE(at::equal(unpack_latents(tokens, 3, 2, 2, 3), x));
  const at::Tensor ids = image_ids(1, 2, 3, at::TensorOptions());
  EXPECT_TRUE(at::equal(ids[0][5], at::tensor({0.0f, 1.0f, 2.0f})));  // (0, row, col)
}

TEST(Flux, ParameterCountsOfFluxDevAndSchnellEqualTheReferences) {
  // The reference Flux built on the meta device (black-forest-labs/flux, FluxParams of flux-dev /
  // flux-schnell): 11,901,408,320 and 11,891,178,560 parameters.
  FluxOptions dev = flux_size("flux-dev"), schnell = flux_size("flux-schnell");
  EXPECT_EQ(flux_parameter_count(dev), 11901408320);
  EXPECT_EQ(flux_parameter_count(schnell), 11891178560);
  // The formula is the module's own count on a size that can be built.
  EXPECT_EQ(flux_parameter_count(reference_options()), count_parameters(*Flux(reference_options())));
}

TEST(Flux, EachUnitFootprintCountsTheParametersOfItsFsdpUnit) {
  // The memory estimate shards by unit: each footprint's count is the module's own parameters
  // under that unit's prefixes (models::UnitPlan), in the plan's order.
  FluxOptions o = reference_options();
  o.guidance_embed = true;
  Flux model(o);
  const UnitPlan plan = model->units();
  std::vector<std::vector<std::string>> prefixes = {plan.stem};
  for (const auto& b : plan.blocks) prefixes.push_back({b});
  prefixes.push_back(plan.head);
  const auto footprints = flux_unit_footprints(o, AttentionSaves::LogSumExp);
  ASSERT_EQ(footprints.size(), prefixes.size());
  for (size_t u = 0; u < prefixes.size(); ++u) {
    int64_t n = 0;
    for (const auto& item : model->named_parameters())
      for (const auto& prefix : prefixes[u])
        if (item.key().rfind(prefix + ".", 0) == 0) n += item.value().numel();
    EXPECT_EQ(footprints[u].parameters, n) << footprints[u].name;
  }
}

TEST(Flux, TextDropoutZeroesEachTextInputIndependently) {
  Flux model(reference_options());
  const ConditioningDropout d = model->conditioning_dropout();
  ASSERT_EQ(d.probabilities.size(), 2u);  // txt and vec, each with model.text_dropout
  const Conditioning cond{{"txt", at::ones({3, 5, 32})}, {"vec", at::ones({3, 16})}, {"guidance", at::ones({3})}};
  const at::Tensor first = at::tensor({1, 0, 1}).to(at::kBool), second = at::tensor({0, 0, 1}).to(at::kBool);
  const Conditioning out = d.apply(cond, {first, second});
  EXPECT_TRUE(at::equal(out.at("txt").sum({1, 2}), at::tensor({0.0f, 160.0f, 0.0f})));
  EXPECT_TRUE(at::equal(out.at("vec").sum(1), at::tensor({16.0f, 16.0f, 0.0f})));
  EXPECT_TRUE(at::equal(out.at("guidance"), cond.at("guidance")));
  const Conditioning null = model->null_conditioning(cond);
  EXPECT_EQ(null.at("txt").abs().sum().item<double>(), 0.0);
  EXPECT_EQ(null.at("vec").abs().sum().item<double>(), 0.0);
}
