// The prompt-following judge (trainer/eval/prompt_following.h) on hand-made canvases and readings.
#include "trainer/eval/prompt_following.h"

#include "test_util.h"

namespace flowtrain::trainer {
namespace {

using data::Composition;
using data::CompositionObject;

Composition prompt(std::vector<CompositionObject> objects, bool heldout = false) {
  Composition c;
  c.caption = "hand-made";
  c.objects = std::move(objects);
  c.heldout = heldout;
  return c;
}

CanvasReading reading_of(const Composition& c) {  // what a perfect canvas reads as
  CanvasReading r;
  for (const auto& o : c.objects) r[o.slot] = {false, o.class_id, o.color};
  return r;
}

TEST(PromptFollowing, APerfectCanvasScoresOneAndEachKindOfMistakeCostsItsOwnMetric) {
  const Composition two = prompt({{7, 0, 0}, {8, 2, 3}});  // red sneaker top left, blue bag bottom right
  const PromptScores perfect = score_readings({reading_of(two)}, {two});
  EXPECT_EQ(perfect.prompt_accuracy, 1.0);
  EXPECT_EQ(perfect.object_accuracy, 1.0);
  EXPECT_EQ(perfect.class_accuracy, 1.0);
  EXPECT_EQ(perfect.color_accuracy, 1.0);
  EXPECT_EQ(perfect.position_accuracy, 1.0);

  CanvasReading wrong_color = reading_of(two);
  wrong_color[0].color = 1;  // green instead of red
  const PromptScores c = score_readings({wrong_color}, {two});
  EXPECT_EQ(c.prompt_accuracy, 0.0);
  EXPECT_EQ(c.object_accuracy, 0.5);
  EXPECT_EQ(c.class_accuracy, 1.0);
  EXPECT_EQ(c.color_accuracy, 0.5);
  EXPECT_EQ(c.position_accuracy, 1.0);

  CanvasReading wrong_class = reading_of(two);
  wrong_class[3].class_id = 4;
  EXPECT_EQ(score_readings({wrong_class}, {two}).prompt_accuracy, 0.0);
  EXPECT_EQ(score_readings({wrong_class}, {two}).color_accuracy, 1.0);

  CanvasReading extra = reading_of(two);
  extra[1] = {false, 7, 0};  // an object the prompt did not ask for
  const PromptScores e = score_readings({extra}, {two});
  EXPECT_EQ(e.prompt_accuracy, 0.0);
  EXPECT_EQ(e.object_accuracy, 1.0);  // the asked-for objects are right
  EXPECT_EQ(e.position_accuracy, 0.0);

  CanvasReading moved = reading_of(two);  // the sneaker drawn top right instead of top left
  moved[1] = moved[0];
  moved[0] = SlotReading{};
  EXPECT_EQ(score_readings({moved}, {two}).object_accuracy, 0.5);
  EXPECT_EQ(score_readings({moved}, {two}).position_accuracy, 0.0);

  // Held-out prompts are scored on their own too.
  const Composition held = prompt({{3, 2, 1}}, /*heldout=*/true);
  const PromptScores h = score_readings({reading_of(two), CanvasReading{}}, {two, held});
  EXPECT_EQ(h.num_heldout, 1);
  EXPECT_EQ(h.heldout_prompt_accuracy, 0.0);
  EXPECT_EQ(h.prompt_accuracy, 0.5);
}

TEST(PromptFollowing, ReadsEveryPaletteColourAndEmptySlotsFromPixels) {
  // A garment-like blob: a filled ellipse of grey 180 on black.
  at::Tensor blob = at::zeros({28, 28}, at::kByte);
  for (int y = 0; y < 28; ++y)
    for (int x = 0; x < 28; ++x)
      if ((x - 14) * (x - 14) / 100.0 + (y - 14) * (y - 14) / 144.0 < 1.0) blob[y][x] = 180;
  models::FashionClassifier judge(0);  // untrained: only colours and emptiness are checked here
  std::vector<at::Tensor> canvases;
  for (int64_t color = 0; color < data::kNumColors; ++color)
    canvases.push_back(data::render_composition({{0, color, color % 4}}, {blob}));
  const auto readings = read_canvases(at::stack(canvases), judge);
  for (int64_t color = 0; color < data::kNumColors; ++color) {
    for (int64_t slot = 0; slot < 4; ++slot) {
      EXPECT_EQ(readings[color][slot].empty, slot != color % 4) << color << " " << slot;
      if (slot == color % 4) {
        EXPECT_EQ(readings[color][slot].color, color) << data::composition_color_names()[color];
      }
    }
  }
  // A few stray bright pixels (sampling noise) do not make an object.
  at::Tensor speckled = at::zeros({1, 3, 56, 56}, at::kByte);
  for (int i = 0; i < kMinForeground - 1; ++i) speckled[0][i % 3][3 + i][5] = 255;
  EXPECT_TRUE(read_canvases(speckled, judge)[0][0].empty);
  // Nor does scattered noise covering the slot: one full-bright pixel in every 3×3 block (81 of
  // them, far above kMinForeground) — each one's neighbourhood mean is 1/9 < kForeground.
  at::Tensor scattered = at::zeros({1, 3, 56, 56}, at::kByte);
  for (int y = 1; y < 28; y += 3)
    for (int x = 1; x < 28; x += 3) scattered[0][(x + y) % 3][y][x] = 255;
  EXPECT_TRUE(read_canvases(scattered, judge)[0][0].empty);
  // A thin solid stroke (a sandal strap: 2 pixels wide, 10 long, at 60 % brightness) is an object:
  // inside it the neighbourhood mean is 0.6·6/9 = 0.4.
  at::Tensor strap = at::zeros({1, 3, 56, 56}, at::kByte);
  strap[0][2].narrow(0, 10, 2).narrow(1, 30, 10).fill_(153);
  EXPECT_FALSE(read_canvases(strap, judge)[0][1].empty);
  EXPECT_TRUE(read_canvases(strap, judge)[0][0].empty);
}

}  // namespace
}  // namespace flowtrain::trainer
