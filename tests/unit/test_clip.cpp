// The CLIP text encoder against transformers' own CLIPTextModel: golden files written by
// tests/reference/make_golden.py (section clip).
#include "models/clip/clip.h"

#include "data/safetensors.h"
#include "reference_golden.h"
#include "trainer/checkpoint/state_dict.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace flowtrain {
namespace {

using models::ClipTextEncoder;
using models::ClipTextOptions;

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

TEST(ClipText, ClipLHasTheReleasedKeysShapesAndOrder) {
  // clip_l_keys.txt: CLIPTextModel's state_dict for openai/clip-vit-large-patch14 (meta device),
  // under the released files' `text_model.` prefix.
  const ClipTextEncoder clip(models::clip_l_text_options());
  EXPECT_EQ(test::key_shape_lines(*clip), test::golden_lines("clip_l_keys.txt"));
  int64_t numel = 0;
  for (const auto& p : clip->parameters()) numel += p.numel();
  EXPECT_EQ(models::clip_text_parameter_count(models::clip_l_text_options()), numel);
  EXPECT_EQ(numel, 123060480);  // CLIP-L's text model: 123M parameters
}

TEST(ClipText, EncodesAndPoolsAsTheReference) {
  ClipTextEncoder clip(tiny_clip_options());
  trainer::load_weights_file(*clip, test::golden_path("clip_tiny.safetensors"), "");
  const data::SafetensorsReader io(test::golden_path("clip_tiny_io.safetensors"));
  at::NoGradGuard no_grad;
  const at::Tensor ids = io.get("ids");
  const models::ClipTextOutput out = clip(ids);
  // Tolerance: fp32 both sides through the same kernels, summation order aside (~1e-7 relative
  // per op over two layers). A missing causal mask, scale, bias or the wrong GELU is O(1) off.
  constexpr double kTolerance = 1e-5;
  EXPECT_LT(test::relative_max_error(out.hidden, io.get("hidden")), kTolerance);
  EXPECT_LT(test::relative_max_error(out.pooled, io.get("pooled")), kTolerance);  // eos_token_id 2: the highest id
  ClipTextOptions first_eos = tiny_clip_options();
  first_eos.eos_token_id = 50;
  clip->options = first_eos;
  EXPECT_LT(test::relative_max_error(clip(ids).pooled, io.get("pooled_eos50")), kTolerance);
  // Row 1 is where the rules part: the end token 50 at 5, a higher id at 10.
  EXPECT_GT(test::relative_max_error(out.pooled[1], io.get("pooled_eos50")[1]), 1e-2);
}

}  // namespace
}  // namespace flowtrain
