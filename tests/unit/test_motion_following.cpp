// The motion-following judge (trainer/eval/motion_following.h) on hand-made clips: a perfect clip
// scores 1, the same clip reversed reads the opposite direction, every direction and palette colour
// is read from pixels, crops are centred on the garment, and a garment that changes class between
// frames lowers temporal consistency.
#include "trainer/eval/motion_following.h"

#include "data/compositions.h"

#include <gtest/gtest.h>

namespace flowtrain::trainer {
namespace {

constexpr int64_t kT = 8, kSide = 32;

// A 12 × 10 block of grey 0.8 inside a 16×16 tile, tinted `color`, moved one pixel a frame in
// `direction` on black, as make_moving_fashion moves its garments: uint8 [T, 3, 32, 32].
at::Tensor moving_clip(int64_t color, int64_t direction) {
  at::Tensor tile = at::zeros({16, 16});
  tile.narrow(0, 2, 12).narrow(1, 3, 10).fill_(0.8);
  const at::Tensor tinted = tile.unsqueeze(0) * data::composition_colors()[color].view({3, 1, 1}) * 255.0;
  at::Tensor clip = at::zeros({kT, 3, kSide, kSide});
  for (int64_t t = 0; t < kT; ++t) {
    int64_t y = 8, x = 8;
    if (direction == kLeft) x = 12 - t;
    if (direction == kRight) x = 4 + t;
    if (direction == kUp) y = 12 - t;
    if (direction == kDown) y = 4 + t;
    clip[t].narrow(1, y, 16).narrow(2, x, 16).copy_(tinted);
  }
  return clip.round().to(at::kByte);
}

// A stand-in for the Fashion-MNIST classifier: hands out `classes` in crop order (cycling) and
// checks every crop is 28×28 in [−1, 1] with the garment's mass at its centre.
struct FakeClassifier {
  std::vector<int64_t> classes;
  int64_t calls = 0, crops = 0;
  at::Tensor operator()(const at::Tensor& batch) {
    ++calls;
    EXPECT_EQ(batch.dim(), 4);
    EXPECT_EQ(batch.size(2), 28);
    EXPECT_GE(batch.min().item<float>(), -1.0f);
    EXPECT_LE(batch.max().item<float>(), 1.0f);
    const at::Tensor mass = (batch + 1).squeeze(1);  // [M, 28, 28] ≥ 0
    const at::Tensor ys = at::arange(28, at::kFloat).view({1, 28, 1}), xs = at::arange(28, at::kFloat).view({1, 1, 28});
    const at::Tensor total = mass.sum({1, 2});
    const at::Tensor cy = (mass * ys).sum({1, 2}) / total, cx = (mass * xs).sum({1, 2}) / total;
    // The block is centred in its tile up to a pixel (rows 2..13, cols 3..12 of 16): within
    // ±1.5 of 13.5 after scaling by 28/16.
    EXPECT_LT((cy - 13.5).abs().max().item<float>(), 1.5f);
    EXPECT_LT((cx - 13.5).abs().max().item<float>(), 1.5f);
    at::Tensor out = at::empty({batch.size(0)}, at::kLong);
    for (int64_t i = 0; i < batch.size(0); ++i) out[i] = classes[static_cast<size_t>((crops + i) % int64_t(classes.size()))];
    crops += batch.size(0);
    return out;
  }
};

CropClassifier as_function(FakeClassifier& fake) {
  return [&fake](const at::Tensor& batch) { return fake(batch); };
}

}  // namespace

TEST(MotionFollowing, APerfectClipScoresOneAndItsReverseGetsTheDirectionWrong) {
  FakeClassifier fake{{7}};
  const at::Tensor clip = moving_clip(/*red*/ 0, kRight);
  const at::Tensor clips = at::stack({clip, clip.flip({0})});
  const auto readings = read_clips(clips, as_function(fake));
  ASSERT_EQ(readings.size(), 2u);
  EXPECT_EQ(fake.crops, 2 * kT);  // every frame holds the garment
  const MotionPrompt prompt{"a red sneaker moving right", 7, 0, kRight};
  const MotionScores perfect = score_clip_readings({readings[0]}, {prompt});
  EXPECT_EQ(perfect.prompt_accuracy, 1.0);
  EXPECT_EQ(perfect.class_accuracy, 1.0);
  EXPECT_EQ(perfect.color_accuracy, 1.0);
  EXPECT_EQ(perfect.direction_accuracy, 1.0);
  EXPECT_EQ(perfect.temporal_consistency, 1.0);
  const MotionScores reversed = score_clip_readings({readings[1]}, {prompt});
  EXPECT_EQ(readings[1].direction, kLeft);
  EXPECT_EQ(reversed.direction_accuracy, 0.0);
  EXPECT_EQ(reversed.prompt_accuracy, 0.0);
  EXPECT_EQ(reversed.class_accuracy, 1.0);  // the garment and its colour are still right
  EXPECT_EQ(reversed.color_accuracy, 1.0);
}

TEST(MotionFollowing, ReadsEveryDirectionAndPaletteColourFromPixels) {
  FakeClassifier fake{{3}};
  std::vector<at::Tensor> clips;
  std::vector<MotionPrompt> prompts;
  for (int64_t color = 0; color < 8; ++color)
    for (int64_t direction = 0; direction < 4; ++direction) {
      clips.push_back(moving_clip(color, direction));
      prompts.push_back({"", 3, color, direction});
    }
  const auto readings = read_clips(at::stack(clips), as_function(fake));
  for (size_t i = 0; i < readings.size(); ++i) {
    EXPECT_EQ(readings[i].color, prompts[i].color) << "clip " << i;
    EXPECT_EQ(readings[i].direction, prompts[i].direction) << "clip " << i;
  }
  EXPECT_EQ(score_clip_readings(readings, prompts).prompt_accuracy, 1.0);
  EXPECT_EQ(parse_motion_direction("down"), kDown);
  EXPECT_EQ(parse_motion_direction("sideways"), -1);
}

TEST(MotionFollowing, EmptyClipsScoreZeroAndAMorphingGarmentIsInconsistent) {
  // Frames classified 7, 7, 2, 7, 7, 7, 2, 7: majority 7 in 6 of 8 frames.
  FakeClassifier fake{{7, 7, 2, 7, 7, 7, 2, 7}};
  const at::Tensor clips = at::stack({moving_clip(2, kDown), at::zeros({kT, 3, kSide, kSide}, at::kByte)});
  const auto readings = read_clips(clips, as_function(fake));
  EXPECT_EQ(fake.crops, kT);  // the black clip has no garment to classify
  EXPECT_FALSE(readings[0].empty);
  EXPECT_EQ(readings[0].class_id, 7);
  EXPECT_DOUBLE_EQ(readings[0].temporal_consistency, 6.0 / 8.0);
  EXPECT_TRUE(readings[1].empty);
  const MotionScores s = score_clip_readings(readings, {{"", 7, 2, kDown}, {"", 7, 2, kDown}});
  EXPECT_EQ(s.prompt_accuracy, 0.5);
  EXPECT_EQ(s.direction_accuracy, 0.5);
  EXPECT_DOUBLE_EQ(s.temporal_consistency, (6.0 / 8.0 + 0.0) / 2.0);
  // Noise is not a garment: scattered bright pixels below the neighbourhood threshold read empty.
  at::Tensor speckle = at::zeros({kT, 3, kSide, kSide}, at::kByte);
  speckle.select(3, 5).select(2, 5).fill_(255);
  speckle.select(3, 20).select(2, 17).fill_(255);
  EXPECT_TRUE(read_clips(speckle.unsqueeze(0), as_function(fake))[0].empty);
}

}  // namespace flowtrain::trainer
