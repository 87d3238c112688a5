// The built-in text path: the text encoder (models/text/text_encoder.h) and the text-to-image
// model around Flux (models/text/text_to_image.h).
#include "models/flux/flux.h"
#include "models/text/text_to_image.h"
#include "trainer/families/flux/flux_config.h"
#include "trainer/family.h"
#include "test_util.h"

#include <set>

namespace flowtrain::models {
namespace {

TextEncoderOptions small_encoder() {
  TextEncoderOptions o;
  o.vocab_size = 20;
  o.length = 8;
  o.width = 32;
  o.depth = 2;
  o.heads = 2;
  o.pooled_dim = 16;
  return o;
}

TEST(TextEncoder, PaddingNeverChangesTheRealTokensAndAnEmptyPromptIsZero) {
  at::manual_seed(0);
  TextEncoder enc(small_encoder());
  // Move the norms off their identity init so nothing is vacuous.
  {
    at::NoGradGuard g;
    for (auto& p : enc->parameters()) p.add_(at::randn_like(p) * 0.05);
  }
  const at::Tensor tokens = at::tensor({5, 7, 9, 2, 0, 0, 0, 0}, at::kLong).reshape({1, 8});
  const at::Tensor mask = tokens != 0;
  // The same prompt with other token ids in the padding positions: masked keys, same output.
  at::Tensor noisy = tokens.clone();
  noisy.narrow(1, 4, 4).fill_(11);
  const auto a = enc->forward(tokens, mask), b = enc->forward(noisy, mask);
  EXPECT_TRUE(at::allclose(a.txt, b.txt, 0, 1e-6));  // fp32 round-off only
  EXPECT_TRUE(at::allclose(a.vec, b.vec, 0, 1e-6));
  EXPECT_EQ(a.txt.narrow(1, 4, 4).abs().max().item<float>(), 0.0f);  // padding positions are zero
  EXPECT_GT(a.txt.narrow(1, 0, 4).abs().max().item<float>(), 0.1f);
  // A shorter padded length gives the same real tokens.
  const auto c = enc->forward(tokens.narrow(1, 0, 5), mask.narrow(1, 0, 5));
  EXPECT_TRUE(at::allclose(c.txt.narrow(1, 0, 4), a.txt.narrow(1, 0, 4), 0, 1e-6));
  EXPECT_TRUE(at::allclose(c.vec, a.vec, 0, 1e-6));
  // No token at all (the empty prompt, a dropped caption): SD3's null input, zeros, and finite.
  const auto e = enc->forward(at::zeros({2, 8}, at::kLong), at::zeros({2, 8}, at::kBool));
  EXPECT_EQ(e.txt.abs().max().item<float>(), 0.0f);
  EXPECT_EQ(e.vec.abs().max().item<float>(), 0.0f);
  // Its parameter count is the closed form's.
  EXPECT_EQ(count_parameters(*enc), text_encoder_parameter_count(small_encoder()));
}

std::shared_ptr<TextToImageImpl> small_text_to_image() {
  trainer::ModelConfig m;
  m.arch = "flux";
  m.size = "flux-tiny";
  m.in_channels = 3;
  m.image_size = 8;
  m.patch = 2;
  auto& flux = m.family<trainer::families::FluxConfig>();
  flux.text_len = 8;
  flux.text_encoder_layers = 1;
  flux.text_encoder_heads = 2;
  flux.vocab_size = 20;
  at::manual_seed(0);
  return std::dynamic_pointer_cast<TextToImageImpl>(trainer::build_model(m));
}

TEST(TextToImage, UnitsCoverEveryParameterOnceAndPartsSplitTheKeys) {
  auto model = small_text_to_image();
  ASSERT_TRUE(model);
  const UnitPlan plan = model->units();
  std::vector<std::string> prefixes = plan.stem;
  prefixes.insert(prefixes.end(), plan.blocks.begin(), plan.blocks.end());
  prefixes.insert(prefixes.end(), plan.head.begin(), plan.head.end());
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    int owners = 0;
    for (const auto& prefix : prefixes) owners += name.compare(0, prefix.size() + 1, prefix + ".") == 0;
    EXPECT_EQ(owners, 1) << name;
  }
  // The transformer's part, prefix removed, has exactly the bare Flux's names (the reference keys).
  trainer::ModelConfig bare;
  bare.arch = "flux";
  bare.size = "flux-tiny";
  bare.in_channels = 3;
  bare.image_size = 8;
  bare.patch = 2;
  bare.family<trainer::families::FluxConfig>().text_len = 8;
  std::set<std::string> flux_names, part;
  for (const auto& item : trainer::build_model(bare)->named_parameters()) flux_names.insert(item.key());
  const std::string transformer = TextToImageImpl::kTransformerPrefix;
  for (const auto& item : model->named_parameters())
    if (item.key().rfind(transformer, 0) == 0) part.insert(item.key().substr(transformer.size()));
  EXPECT_EQ(part, flux_names);
  EXPECT_TRUE(flux_names.count("double_blocks.0.txt_attn.norm.key_norm.scale"));
}

TEST(TextToImage, DroppedCaptionsAndTheNullConditioningAreTheEmptyPrompt) {
  auto model = small_text_to_image();
  {
    at::NoGradGuard g;
    for (auto& p : model->parameters()) p.add_(at::randn_like(p) * 0.05);  // off the zero init
  }
  const at::Tensor tokens = at::tensor({5, 7, 2, 0, 0, 0, 0, 0, 9, 2, 0, 0, 0, 0, 0, 0}, at::kLong).reshape({2, 8});
  const Conditioning cond{{"tokens", tokens}, {"txt_mask", tokens != 0}};
  const ConditioningDropout d = model->conditioning_dropout();
  ASSERT_EQ(d.probabilities.size(), 1u);  // one encoder: one draw per sample
  const Conditioning dropped = d.apply(cond, {at::tensor({1, 0}, at::kLong).to(at::kBool)});
  EXPECT_EQ(dropped.at("txt_mask")[0].sum().item<int64_t>(), 0);
  EXPECT_TRUE(dropped.at("txt_mask")[1].equal(cond.at("txt_mask")[1]));

  const at::Tensor x = at::randn({2, 3, 8, 8}), t = at::full({2}, 0.5);
  const Conditioning empty{{"tokens", at::zeros_like(tokens)}, {"txt_mask", at::zeros({2, 8}, at::kBool)}};
  const at::Tensor v_null = model->forward(x, t, model->null_conditioning(cond));
  EXPECT_TRUE(v_null.equal(model->forward(x, t, empty)));  // the empty prompt is the unconditional one
  EXPECT_FALSE(v_null.equal(model->forward(x, t, cond)));  // and the text does reach the image
  const at::Tensor v_dropped = model->forward(x, t, dropped);
  EXPECT_TRUE(v_dropped[0].equal(v_null[0]));
}

}  // namespace
}  // namespace flowtrain::models
