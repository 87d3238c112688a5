// AdamW, LR schedule and gradient clipping against float64 re-derivations of the formulas.
#include "trainer/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace flowtrain::trainer;

TEST(AdamW, MatchesFloat64ReferenceWithDecoupledWeightDecay) {
  at::manual_seed(0);
  at::Tensor p = at::randn({5}).set_requires_grad(true);
  at::Tensor ref = p.detach().to(at::kDouble).clone();
  AdamWOptions o{0.9, 0.95, 1e-8, 0.1};
  AdamW opt({{"w", p}}, o);
  at::Tensor m = at::zeros({5}, at::kDouble), v = at::zeros({5}, at::kDouble);
  const double lrs[] = {1e-2, 5e-3, 2e-3, 1e-3};
  for (int step = 1; step <= 4; ++step) {
    at::Tensor g = at::randn({5});
    p.mutable_grad() = g.clone();
    opt.step(lrs[step - 1]);
    // float64 reference of torch.optim.AdamW (Loshchilov & Hutter, decoupled decay)
    const double lr = lrs[step - 1];
    at::Tensor gd = g.to(at::kDouble);
    ref = ref * (1 - lr * o.weight_decay);
    m = o.beta1 * m + (1 - o.beta1) * gd;
    v = o.beta2 * v + (1 - o.beta2) * gd * gd;
    at::Tensor mhat = m / (1 - std::pow(o.beta1, step)), vhat = v / (1 - std::pow(o.beta2, step));
    ref = ref - lr * mhat / (vhat.sqrt() + o.eps);
    // fp32 state vs fp64: each update is ~lr in size, relative rounding ~1e-7 of O(1) weights
    EXPECT_TRUE(at::allclose(p.detach().to(at::kDouble), ref, 0, 1e-6)) << "step " << step;
  }
  EXPECT_EQ(opt.step_count(), 4);
}

// The update runs in two implementations: ATen's fused AdamW kernel for contiguous tensors and a
// per-tensor op loop for the rest (e.g. a non-contiguous shard view). Both against the float64
// formula, on tensors long enough for the fused kernel's vector loop and its tail (1003 values).
TEST(AdamW, FusedAndLoopPathsMatchFloat64Reference) {
  at::manual_seed(1);
  at::Tensor a = at::randn({1003}).set_requires_grad(true);             // fused kernel
  at::Tensor b = at::randn({17, 59}).t().set_requires_grad(true);       // non-contiguous: loop
  ASSERT_FALSE(b.is_contiguous());
  AdamWOptions o{0.9, 0.99, 1e-8, 0.05};
  AdamW opt({{"a", a}, {"b", b}}, o);
  struct Ref { at::Tensor p, m, v; };
  std::vector<Ref> refs;
  for (const auto& p : {a, b})
    refs.push_back({p.detach().to(at::kDouble).clone(), at::zeros(p.sizes(), at::kDouble), at::zeros(p.sizes(), at::kDouble)});
  for (int step = 1; step <= 5; ++step) {
    const double lr = 1e-2 / step;
    std::vector<at::Tensor> gs = {at::randn({1003}), at::randn({17, 59}).t()};
    a.mutable_grad() = gs[0];
    b.mutable_grad() = gs[1];
    opt.step(lr);
    for (size_t i = 0; i < 2; ++i) {
      Ref& r = refs[i];
      at::Tensor g = gs[i].to(at::kDouble);
      r.p = r.p * (1 - lr * o.weight_decay);
      r.m = o.beta1 * r.m + (1 - o.beta1) * g;
      r.v = o.beta2 * r.v + (1 - o.beta2) * g * g;
      r.p = r.p - lr * (r.m / (1 - std::pow(o.beta1, step))) / ((r.v / (1 - std::pow(o.beta2, step))).sqrt() + o.eps);
      at::Tensor p = i == 0 ? a : b;
      // as above: fp32 rounding of O(1) weights and of ~lr-sized updates
      EXPECT_TRUE(at::allclose(p.detach().to(at::kDouble), r.p, 0, 1e-6)) << "param " << i << " step " << step;
      const auto& slot = opt.slots()[i];
      EXPECT_TRUE(at::allclose(slot.exp_avg.to(at::kDouble), r.m, 1e-6, 1e-7)) << "m " << i << " step " << step;
      EXPECT_TRUE(at::allclose(slot.exp_avg_sq.to(at::kDouble), r.v, 1e-6, 1e-9)) << "v " << i << " step " << step;
    }
  }
}

TEST(AdamW, SkipsFixedParametersAndParamsWithoutGrad) {
  at::Tensor fixed = at::ones({2});  // requires_grad false, like pos_embed
  at::Tensor a = at::ones({2}).set_requires_grad(true), b = at::ones({2}).set_requires_grad(true);
  AdamW opt({{"fixed", fixed}, {"a", a}, {"b", b}}, {});
  ASSERT_EQ(opt.slots().size(), 2u);
  a.mutable_grad() = at::ones({2});
  opt.step(0.1);
  EXPECT_LT(a.max().item<float>(), 1.0f);
  EXPECT_EQ(b.max().item<float>(), 1.0f);
  EXPECT_EQ(opt.slots()[1].exp_avg.abs().sum().item<float>(), 0.0f);
}

TEST(LrSchedule, WarmupThenCosineToFloor) {
  LrSchedule s{1.0, 10, ScheduleKind::cosine, 110, 0.1};
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1.0);
  EXPECT_NEAR(s.lr_at(60), 0.1 + 0.45, 1e-12);  // half way: floor + half the span
  EXPECT_NEAR(s.lr_at(110), 0.1, 1e-12);
  LrSchedule c{2.0, 0, ScheduleKind::constant, 100, 0.0};
  EXPECT_DOUBLE_EQ(c.lr_at(0), 2.0);
  EXPECT_DOUBLE_EQ(c.lr_at(99), 2.0);
}

TEST(ClipGradNorm, GlobalNormAndScaling) {
  at::Tensor a = at::zeros({2}).set_requires_grad(true), b = at::zeros({1}).set_requires_grad(true);
  a.mutable_grad() = at::tensor({3.0f, 0.0f});
  b.mutable_grad() = at::tensor({4.0f});
  at::Tensor norm = clip_grad_norm({a, b}, 1.0);
  EXPECT_FLOAT_EQ(norm.item<float>(), 5.0f);
  const double total_after = std::sqrt(std::pow(a.grad()[0].item<double>(), 2) + std::pow(b.grad()[0].item<double>(), 2));
  EXPECT_NEAR(total_after, 1.0, 1e-5);  // scaled by 1/(5 + 1e-6)
  // below the threshold nothing changes
  a.mutable_grad() = at::tensor({0.3f, 0.0f});
  b.mutable_grad() = at::tensor({0.4f});
  clip_grad_norm({a, b}, 1.0);
  EXPECT_FLOAT_EQ(b.grad()[0].item<float>(), 0.4f);
  // a NaN gradient is reported, not hidden
  b.mutable_grad() = at::tensor({NAN});
  EXPECT_TRUE(std::isnan(clip_grad_norm({a, b}, 1.0).item<float>()));
  EXPECT_FLOAT_EQ(a.grad()[0].item<float>(), 0.3f);
}
