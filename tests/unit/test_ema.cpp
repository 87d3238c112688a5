// EMA: the update formula and the warm-up schedule of the decay.
#include "trainer/ema.h"

#include "models/dit/dit.h"

#include <gtest/gtest.h>

using namespace flowtrain;

TEST(Ema, UpdateIsLerpTowardsTheWeights) {
  at::Tensor w = at::randn({3, 4}).requires_grad_();
  trainer::Ema ema({w});
  at::Tensor& e = ema.tensors()[0];
  EXPECT_TRUE(at::equal(w, e));  // starts as a copy
  EXPECT_FALSE(e.requires_grad());
  const at::Tensor before = e.clone();
  {
    at::NoGradGuard no_grad;
    w.add_(1.0);
  }
  ema.update({w}, 0.75);
  // ema ← 0.75·ema + 0.25·w = before + 0.25 (w moved by exactly 1); fp32 rounding of O(1) values
  EXPECT_TRUE(at::allclose(e, before + 0.25, 0, 1e-6));
  EXPECT_FALSE(e.requires_grad());
}

TEST(Ema, SwappingParameterDataComputesWithTheEmaAndRestores) {
  models::DiTOptions o = models::dit_size("tiny");
  o.input_size = 8;
  o.in_channels = 1;
  o.num_classes = 3;
  o.depth = 1;
  models::DiT model(o);
  const auto params = model->parameters();
  std::vector<at::Tensor> other;
  for (const auto& p : params) other.push_back(at::full_like(p, 0.5));
  const at::Tensor original = params[0].detach().clone();
  trainer::swap_parameter_data(params, other);
  EXPECT_TRUE(at::equal(model->parameters()[0], at::full_like(original, 0.5)));  // the model sees the EMA values
  EXPECT_TRUE(at::equal(other[0], original));
  EXPECT_TRUE(model->parameters()[1].requires_grad());  // still the same leaf parameters ([0] is the fixed pos_embed)
  trainer::swap_parameter_data(params, other);
  EXPECT_TRUE(at::equal(model->parameters()[0], original));
  EXPECT_TRUE(at::equal(other[0], at::full_like(original, 0.5)));
}

TEST(Ema, WarmupDecaySchedule) {
  using trainer::Ema;
  EXPECT_DOUBLE_EQ(Ema::decay_at(0.999, true, 0), 0.1);         // (1+0)/(10+0)
  EXPECT_DOUBLE_EQ(Ema::decay_at(0.999, true, 90), 0.91);       // 91/100
  EXPECT_DOUBLE_EQ(Ema::decay_at(0.999, true, 100000), 0.999);  // capped
  EXPECT_DOUBLE_EQ(Ema::decay_at(0.999, false, 0), 0.999);
}
