// The video configuration of the Flux MMDiT (models/flux/): 3-D patching (pt × p × p, frame-major
// tokens), 3-D position ids (t, row, col) and the RoPE they drive against float64, T = 1 equal to
// the image model bit for bit, the frame axis actually used, and FLOPs that count attention's T².
#include "models/flux/flux.h"
#include "models/flux/rope.h"
#include "rope_reference.h"

#include <gtest/gtest.h>
#include <torch/nn/init.h>

#include <cmath>

using namespace flowtrain::models;

namespace {

FluxOptions tiny_video(int64_t frames, int64_t patch_t) {
  FluxOptions o = flux_size("flux-tiny");  // hidden 64, 2 heads of 32 = RoPE axes (8, 12, 12)
  o.in_channels = 3;
  o.patch = 2;
  o.input_size = 4;
  o.frames = frames;
  o.patch_t = patch_t;
  o.text_len = 3;
  return o;
}

// Every parameter N(0, 0.2): adaLN-Zero would make the output 0 and hide the blocks.
void randomize(torch::nn::Module& m) {
  at::NoGradGuard no_grad;
  for (auto& p : m.parameters()) torch::nn::init::normal_(p, 0.0, 0.2);
}

Conditioning text_of(int64_t B, const FluxOptions& o) {
  return Conditioning{{"txt", at::randn({B, o.text_len, o.context_dim})}, {"vec", at::randn({B, o.vec_dim})}};
}

}  // namespace

TEST(FluxVideo, PackingIsFrameMajorInConv3dPatchOrderAndUnpacks) {
  const int64_t B = 2, C = 3, T = 4, H = 4, W = 6, pt = 2, p = 2;
  const at::Tensor x = at::arange(B * C * T * H * W, at::kFloat).reshape({B, C, T, H, W});
  const at::Tensor tokens = pack_video_latents(x, pt, p);  // [2, (4/2)·(4/2)·(6/2) = 12, 3·2·2·2 = 24]
  ASSERT_EQ(tokens.sizes(), at::IntArrayRef({B, 12, C * pt * p * p}));
  // Token (t 1, row 0, col 2) = 1·(2·3) + 0·3 + 2 = 8 holds x[:, c, 2..3, 0..1, 4..5] in (c, pt, ph, pw)
  // order: a Conv3d weight [D, C, pt, ph, pw] flattened.
  const at::Tensor want = x.narrow(2, 2, 2).narrow(3, 0, 2).narrow(4, 4, 2).reshape({B, 24});
  EXPECT_TRUE(at::equal(tokens.select(1, 8), want));
  EXPECT_TRUE(at::equal(unpack_video_latents(tokens, C, pt, p, 2, 2, 3), x));
  // Ids follow the tokens: (frame, row, col), frame-major.
  const at::Tensor ids = video_ids(B, 2, 2, 3, at::TensorOptions());
  ASSERT_EQ(ids.sizes(), at::IntArrayRef({B, 12, 3}));
  EXPECT_TRUE(at::equal(ids[1][8], at::tensor({1.0f, 0.0f, 2.0f})));
  EXPECT_TRUE(at::equal(ids[0][11], at::tensor({1.0f, 1.0f, 2.0f})));
  // One frame is the image case exactly: same tokens, same ids (0, row, col).
  const at::Tensor frame = x.narrow(2, 0, 1);
  EXPECT_TRUE(at::equal(pack_video_latents(frame, 1, p), pack_latents(frame.squeeze(2), p)));
  EXPECT_TRUE(at::equal(video_ids(B, 1, 2, 3, at::TensorOptions()), image_ids(B, 2, 3, at::TensorOptions())));
}

// HunyuanVideo's split of a 128-channel head, (16, 56, 56) over (t, h, w), theta 256, on the ids of
// a 3 × 2 × 4 token grid: pair i of axis a rotates by id_a · θ^(−2i/axes[a]) in float64. Shows the
// frame index drives exactly the first 16 channels and rows/columns the other two slices.
TEST(FluxVideo, ThreeAxisRopeOnVideoIdsMatchesFloat64) {
  at::manual_seed(21);
  const std::vector<int64_t> axes = {16, 56, 56};
  const double theta = 256.0;
  const int64_t H = 2, Dh = 128;
  const at::Tensor ids = video_ids(1, 3, 2, 4, at::TensorOptions());
  const int64_t L = ids.size(1);
  const at::Tensor x = at::randn({1, H, L, Dh}, at::kDouble);
  const at::Tensor got = apply_rope(x.to(at::kFloat), rope_angles(ids, axes, theta));
  const at::Tensor want = flowtrain::test::rope_float64(x, ids, axes, theta);
  // fp32 angles up to 3 rad carry ~3·2⁻²⁴ error, times |x| ≤ ~5, plus the rotation's rounding: < 1e-5.
  EXPECT_LT((got.to(at::kDouble) - want).abs().max().item<double>(), 1e-5);
  // Tokens of frame 0 leave the time slice unrotated; frame 2's rotate it.
  const at::Tensor time_slice = got.narrow(3, 0, 16).to(at::kDouble) - x.narrow(3, 0, 16);
  EXPECT_LT(time_slice.narrow(2, 0, 8).abs().max().item<double>(), 1e-6);
  EXPECT_GT(time_slice.narrow(2, 16, 8).abs().max().item<double>(), 0.1);
}

// A one-frame clip is an image: the same weights give the same velocity, bit for bit, so an image
// run and a video run share weights (patch_t 1: the same img_in shape).
TEST(FluxVideo, OneFrameClipEqualsTheImageModelBitForBit) {
  at::manual_seed(22);
  Flux image_model(tiny_video(1, 1));
  randomize(*image_model);
  Flux video_model(tiny_video(4, 1));
  ASSERT_EQ(video_model->img_in->weight.sizes(), image_model->img_in->weight.sizes());
  {
    at::NoGradGuard no_grad;
    auto src = image_model->named_parameters();
    for (auto& p : video_model->named_parameters()) p.value().copy_(src[p.key()]);
  }
  const int64_t B = 2;
  const at::Tensor x = at::randn({B, 3, 4, 4}), t = at::rand({B});
  const Conditioning cond = text_of(B, image_model->options);
  at::NoGradGuard no_grad;
  const at::Tensor image_v = image_model->forward(x, t, cond);
  const at::Tensor clip_v = video_model->forward(x.unsqueeze(2), t, cond);
  ASSERT_EQ(clip_v.sizes(), at::IntArrayRef({B, 3, 1, 4, 4}));
  EXPECT_TRUE(at::equal(clip_v.squeeze(2), image_v));
  EXPECT_EQ(video_model->sample_shape(), (std::vector<int64_t>{3, 4, 4, 4}));
  EXPECT_EQ(image_model->sample_shape(), (std::vector<int64_t>{3, 4, 4}));
}

// The frame axis is seen: with ids (t, row, col), reversing a clip's frames does not just reverse
// the velocity (it would if the model were blind to time, attention being permutation-equivariant
// without positions); with patch_t 2 the tokens pair frames and the clip still round-trips.
TEST(FluxVideo, FrameOrderMattersAndTemporalPatchesRoundTrip) {
  at::manual_seed(23);
  for (const int64_t pt : {int64_t{1}, int64_t{2}}) {
    Flux model(tiny_video(4, pt));
    randomize(*model);
    const int64_t B = 2;
    const at::Tensor x = at::randn({B, 3, 4, 4, 4}), t = at::rand({B});
    const Conditioning cond = text_of(B, model->options);
    at::NoGradGuard no_grad;
    const at::Tensor v = model->forward(x, t, cond);
    ASSERT_EQ(v.sizes(), x.sizes()) << "patch_t " << pt;
    const at::Tensor reversed = at::flip(x, {2});
    const at::Tensor v_reversed = model->forward(reversed, t, cond);
    // O(1) outputs; a time-blind model would agree to ~1e-6.
    EXPECT_GT((at::flip(v_reversed, {2}) - v).abs().max().item<double>(), 1e-2) << "patch_t " << pt;
  }
  EXPECT_THROW(Flux(tiny_video(3, 2)), c10::Error);  // 3 frames do not pair up
}

// FLOPs per sample count the joint sequence's attention, 4·L·D per token per block with L = video
// + text tokens: doubling the frames doubles the per-token work and quadruples attention.
TEST(FluxVideo, FlopsCountAttentionQuadraticallyInTheVideoLength) {
  const FluxOptions a = tiny_video(4, 1), b = tiny_video(8, 1);
  const double D = double(a.hidden), blocks = double(a.depth + a.depth_single);
  const double La = double(a.image_tokens() + a.text_len), Lb = double(b.image_tokens() + b.text_len);
  ASSERT_EQ(a.image_tokens(), 4 * 2 * 2);
  ASSERT_EQ(b.image_tokens(), 8 * 2 * 2);
  // Everything but attention is linear in the tokens (+ per-sample terms that cancel in the
  // difference of differences); attention adds blocks · 4·L²·D.
  const double attention_a = blocks * 4.0 * La * La * D, attention_b = blocks * 4.0 * Lb * Lb * D;
  const FluxOptions c = tiny_video(12, 1);
  const double Lc = double(c.image_tokens() + c.text_len), attention_c = blocks * 4.0 * Lc * Lc * D;
  const double fa = flux_forward_flops_per_sample(a) - attention_a, fb = flux_forward_flops_per_sample(b) - attention_b,
               fc = flux_forward_flops_per_sample(c) - attention_c;
  // What is left is affine in the token count: equal steps of 4 frames add equal FLOPs.
  EXPECT_NEAR(fc - fb, fb - fa, 1e-9 * fc);
  EXPECT_GT(fb - fa, 0.0);
}
