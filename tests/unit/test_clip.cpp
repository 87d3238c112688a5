// The CLIP text encoder against transformers' own CLIPTextModel: golden files written by
// tests/reference/make_golden.py (section clip).
#include "models/text/clip.h"

#include "data/safetensors.h"
#include "test_util.h"
#include "trainer/checkpoint/state_dict.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

namespace flowtrain {
namespace {

using models::ClipTextEncoder;
using models::ClipTextOptions;

std::string clip_golden(const std::string& name) { return test::source_path("tests/reference/golden/" + name); }

ClipTextOptions tiny_clip_options() {
  ClipTextOptions o;
  o.vocab_size = 100;
  o.hidden = 32;
  o.intermediate = 48;
  o.layers = 2;
  o.heads = 4;
  o.max_positions = 16;
  return o;
}

double clip_relative_error(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

TEST(ClipText, ClipLHasTheReleasedKeysShapesAndOrder) {
  // clip_l_keys.txt: CLIPTextModel's state_dict for openai/clip-vit-large-patch14 (meta device),
  // under the released files' `text_model.` prefix.
  std::ifstream in(clip_golden("clip_l_keys.txt"));
  ASSERT_TRUE(in);
  std::vector<std::string> expected;
  for (std::string line; std::getline(in, line);) expected.push_back(line);
  const ClipTextEncoder clip(models::clip_l_text_options());
  std::vector<std::string> actual;
  int64_t numel = 0;
  for (const auto& p : clip->named_parameters()) {
    std::string line = p.key() + " ";
    for (int64_t i = 0; i < p.value().dim(); ++i) line += (i ? "," : "") + std::to_string(p.value().size(i));
    actual.push_back(line);
    numel += p.value().numel();
  }
  EXPECT_EQ(actual, expected);
  EXPECT_EQ(models::clip_text_parameter_count(models::clip_l_text_options()), numel);
  EXPECT_EQ(numel, 123060480);  // CLIP-L's text model: 123M parameters
}

TEST(ClipText, EncodesAndPoolsAsTheReference) {
  ClipTextEncoder clip(tiny_clip_options());
  trainer::load_weights_file(*clip, clip_golden("clip_tiny.safetensors"), "");
  const data::SafetensorsReader io(clip_golden("clip_tiny_io.safetensors"));
  at::NoGradGuard no_grad;
  const at::Tensor ids = io.get("ids");
  const models::ClipTextOutput out = clip(ids);
  // Tolerance: fp32 both sides through the same kernels, summation order aside (~1e-7 relative
  // per op over two layers). A missing causal mask, scale, bias or the wrong GELU is O(1) off.
  constexpr double kTolerance = 1e-5;
  EXPECT_LT(clip_relative_error(out.hidden, io.get("hidden")), kTolerance);
  EXPECT_LT(clip_relative_error(out.pooled, io.get("pooled")), kTolerance);  // eos_token_id 2: the highest id
  ClipTextOptions first_eos = tiny_clip_options();
  first_eos.eos_token_id = 50;
  clip->options = first_eos;
  EXPECT_LT(clip_relative_error(clip(ids).pooled, io.get("pooled_eos50")), kTolerance);
  // Row 1 is where the rules part: the end token 50 at 5, a higher id at 10.
  EXPECT_GT(clip_relative_error(out.pooled[1], io.get("pooled_eos50")[1]), 1e-2);
}

}  // namespace
}  // namespace flowtrain
