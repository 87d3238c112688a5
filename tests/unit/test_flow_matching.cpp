// Flow-matching objective, timestep samplers and ODE samplers against closed forms.
#include "models/flow_matching.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>

using namespace flowtrain::models;

namespace {
at::Generator make_gen(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }
}  // namespace

TEST(FlowMatching, InterpolationAndTargetFluxConvention) {
  at::Tensor x0 = at::full({2, 1, 2, 2}, 2.0), noise = at::full({2, 1, 2, 2}, -1.0);
  at::Tensor x = interpolate(x0, noise, at::tensor({0.0f, 0.25f}));
  EXPECT_FLOAT_EQ(x[0].max().item<float>(), 2.0f);                 // t = 0: data
  EXPECT_FLOAT_EQ(x[1].max().item<float>(), 0.75f * 2 + 0.25f * -1);  // (1−t)·x0 + t·ε
}

TEST(FlowMatching, LossOfExactVelocityIsZeroAndOfZeroModelIsE_v2) {
  at::Tensor x0 = at::randn({64, 1, 4, 4}, make_gen(3));
  const Conditioning cond{{"labels", at::zeros({64}, at::kLong)}};
  TimestepSampler ts;
  const ConditioningDropout none;
  // A model that knows x0 predicts v = ε − x0 exactly: from x_t = (1−t)x0 + tε, ε = (x_t − (1−t)x0)/t.
  VelocityFn oracle = [&](const at::Tensor& x, const at::Tensor& t, const Conditioning&) {
    at::Tensor tb = t.reshape({-1, 1, 1, 1});
    at::Tensor eps = (x - (1 - tb) * x0) / tb;
    return eps - x0;
  };
  at::Generator g1 = make_gen(7);
  EXPECT_LT(flow_matching_loss(oracle, x0, draw_flow_matching_inputs(x0, cond, ts, none, g1)).loss.item<float>(), 1e-8);
  // The zero model's loss is mean((ε − x0)²); same generator seed → same ε, recomputed here.
  VelocityFn zero = [](const at::Tensor& x, const at::Tensor&, const Conditioning&) { return at::zeros_like(x); };
  at::Generator g2 = make_gen(7), g3 = make_gen(7);
  const float loss = flow_matching_loss(zero, x0, draw_flow_matching_inputs(x0, cond, ts, none, g2)).loss.item<float>();
  ts.sample(64, g3, x0.options());
  at::Tensor eps = at::randn(x0.sizes(), g3);
  EXPECT_NEAR(loss, (eps - x0).pow(2).mean().item<float>(), 1e-6);
}

TEST(FlowMatching, LogitNormalMoments) {
  TimestepSampler ts;
  ts.logit_mean = 0.5;
  ts.logit_std = 0.8;
  const int64_t n = 200000;
  at::Generator g = make_gen(11);
  at::Tensor t = ts.sample(n, g, at::TensorOptions().dtype(at::kDouble));
  EXPECT_GT(t.min().item<double>(), 0.0);
  EXPECT_LT(t.max().item<double>(), 1.0);
  at::Tensor u = at::log(t / (1 - t));  // logit recovers the normal draw
  // standard error of the mean is 0.8/sqrt(2e5) ≈ 0.0018; of the std ≈ 0.8/sqrt(4e5) ≈ 0.0013:
  // 5 standard errors
  EXPECT_NEAR(u.mean().item<double>(), 0.5, 0.009);
  EXPECT_NEAR(u.std().item<double>(), 0.8, 0.0065);
}

TEST(FlowMatching, UniformWithShiftHasAnalyticMean) {
  TimestepSampler ts;
  ts.distribution = TimestepDistribution::Uniform;
  ts.shift = 3.0;
  at::Generator g = make_gen(5);
  at::Tensor t = ts.sample(200000, g, at::TensorOptions().dtype(at::kDouble));
  // E[αt/(1+(α−1)t)] for t ~ U(0,1), α = 3: ∫ 3t/(1+2t) dt = 3/2 − 3·ln(3)/4 ≈ 0.67604
  const double expected = 1.5 - 0.75 * std::log(3.0);
  // std of t' < 0.3, standard error < 0.3/sqrt(2e5) ≈ 7e-4: 5 standard errors
  EXPECT_NEAR(t.mean().item<double>(), expected, 0.0035);
  EXPECT_NEAR(shift_time(at::tensor({0.5}, at::kDouble), 3.0).item<double>(), 0.75, 1e-12);
}

TEST(FlowMatching, ConditioningDropoutDrawsOneIndependentUniformPerEntry) {
  // Two entries, as SD3 drops each text encoder: "a" nulled with p 0.3, "b" with p 0.5,
  // independently, so both are null with probability 0.15.
  ConditioningDropout dropout;
  dropout.probabilities = {0.3, 0.5};
  dropout.apply = [](const Conditioning& c, const std::vector<at::Tensor>& dropped) {
    Conditioning out = c;
    out.set("a", at::where(dropped[0], at::full_like(c.at("a"), -1), c.at("a")));
    out.set("b", at::where(dropped[1], at::full_like(c.at("b"), -1), c.at("b")));
    return out;
  };
  const int64_t n = 100000;
  const Conditioning cond{{"a", at::zeros({n}, at::kLong)}, {"b", at::zeros({n}, at::kLong)}};
  at::Generator g = make_gen(9);
  const FlowMatchingDraw d = draw_flow_matching_inputs(at::zeros({n, 1}), cond, TimestepSampler{}, dropout, g);
  const at::Tensor a = d.cond.at("a").eq(-1).to(at::kDouble), b = d.cond.at("b").eq(-1).to(at::kDouble);
  // Binomial standard errors: sqrt(p(1−p)/1e5) ≤ 0.0016; 5 standard errors.
  EXPECT_NEAR(a.mean().item<double>(), 0.3, 0.0075);
  EXPECT_NEAR(b.mean().item<double>(), 0.5, 0.008);
  EXPECT_NEAR((a * b).mean().item<double>(), 0.15, 0.0060);  // independent draws
  // The per-row draw (the trainer's CPU path) uses the same rule, one generator per row.
  const FlowMatchingDraw rows = draw_flow_matching_inputs_per_row(
      at::zeros({2000, 1}), cond.rows(0, 2000), TimestepSampler{}, dropout, [](int64_t row) { return 100 + row; }, 0);
  EXPECT_NEAR(rows.cond.at("a").eq(-1).to(at::kDouble).mean().item<double>(), 0.3, 0.05);  // ~5 s.e. at n = 2000
}

// dx/dt = x has x(0) = x(1)·e^{-1} when integrated from t = 1 down to 0. Euler is first order,
// Heun (Euler on the last step) second order: halving the step halves / quarters the error.
TEST(FlowMatchingSamplers, EulerAndHeunConvergeAtTheirOrder) {
  VelocityFn field = [](const at::Tensor& x, const at::Tensor&, const Conditioning&) { return x; };
  at::Tensor x1 = at::ones({1, 1}, at::kDouble);
  const Conditioning none;
  const double exact = std::exp(-1.0);
  auto error = [&](SamplerKind kind, int64_t steps) {
    SamplerOptions o;
    o.kind = kind;
    o.steps = steps;
    return std::abs(sample(field, x1, none, none, o).item<double>() - exact);
  };
  const double e50 = error(SamplerKind::Euler, 50), e100 = error(SamplerKind::Euler, 100);
  EXPECT_NEAR(e50 / e100, 2.0, 0.1);
  const double h50 = error(SamplerKind::Heun, 50), h100 = error(SamplerKind::Heun, 100);
  EXPECT_NEAR(h50 / h100, 4.0, 0.4);
  EXPECT_LT(h100, 1e-4);
  EXPECT_LT(h100, e100 / 50);
}

TEST(FlowMatchingSamplers, ClassifierFreeGuidanceCombination) {
  // v depends only on the label: conditional 1.0, unconditional (null class 9) 0.25.
  VelocityFn field = [](const at::Tensor& x, const at::Tensor&, const Conditioning& c) {
    const at::Tensor& y = c.at("labels");
    return at::where(y.eq(9), at::full({y.size(0)}, 0.25, x.options()), at::ones({y.size(0)}, x.options()))
        .reshape({-1, 1});
  };
  SamplerOptions o;
  o.steps = 1;
  o.cfg_scale = 3.0;
  const Conditioning cond{{"labels", at::tensor({int64_t{0}, int64_t{1}})}};
  const Conditioning null{{"labels", at::full({2}, 9, at::kLong)}};
  at::Tensor out = sample(field, at::zeros({2, 1}, at::kDouble), cond, null, o);
  // one Euler step from t = 1 to 0: x = 0 − (v_u + w·(v_c − v_u)) = −(0.25 + 3·0.75) = −2.5
  EXPECT_NEAR(out[0][0].item<double>(), -2.5, 1e-12);
}

TEST(FlowMatchingSamplers, TimeGridIsShifted) {
  at::Tensor t = sampling_times(4, 3.0);
  EXPECT_DOUBLE_EQ(t[0].item<double>(), 1.0);
  EXPECT_DOUBLE_EQ(t[4].item<double>(), 0.0);
  EXPECT_NEAR(t[2].item<double>(), 0.75, 1e-12);  // 3·0.5/(1+2·0.5)
}
