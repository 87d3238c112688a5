// EMA: the update formula and the warm-up schedule of the decay.
#include "trainer/ema.h"

#include <gtest/gtest.h>

using namespace flowtrain;

TEST(Ema, UpdateIsLerpTowardsTheWeights) {
  models::DiTOptions o = models::dit_size("tiny");
  o.input_size = 8;
  o.in_channels = 1;
  o.num_classes = 3;
  o.depth = 1;
  models::DiT model(o);
  trainer::Ema ema(model);
  at::Tensor w = model->blocks[0]->as<models::DiTBlock>()->attn->qkv->weight;
  at::Tensor e = ema.model()->blocks[0]->as<models::DiTBlock>()->attn->qkv->weight;
  EXPECT_TRUE(at::equal(w, e));  // starts as a copy
  const at::Tensor before = e.clone();
  {
    at::NoGradGuard no_grad;
    w.add_(1.0);
  }
  ema.update(model, 0.75);
  // ema ← 0.75·ema + 0.25·w = before + 0.25 (w moved by exactly 1); fp32 rounding of O(1) values
  EXPECT_TRUE(at::allclose(e, before + 0.25, 0, 1e-6));
  EXPECT_FALSE(e.requires_grad());
}

TEST(Ema, WarmupDecaySchedule) {
  using trainer::Ema;
  EXPECT_DOUBLE_EQ(Ema::decay_at(0.999, true, 0), 0.1);         // (1+0)/(10+0)
  EXPECT_DOUBLE_EQ(Ema::decay_at(0.999, true, 90), 0.91);       // 91/100
  EXPECT_DOUBLE_EQ(Ema::decay_at(0.999, true, 100000), 0.999);  // capped
  EXPECT_DOUBLE_EQ(Ema::decay_at(0.999, false, 0), 0.999);
}
