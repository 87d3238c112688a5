// The health detectors' arithmetic on made-up series (trainer/health/detectors.h): each verdict
// fires on the pattern it exists for, at the right step, and stays quiet on the ordinary noise
// next to it. Batch ordinals parse singles and ranges. Non-finite gradients are named from
// the end nearest the fault, checked against a NaN made inside a real backward pass.
#include "trainer/config/config.h"
#include "trainer/health/batch_ordinals.h"
#include "trainer/health/block_telemetry.h"
#include "trainer/health/detectors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

using namespace flowtrain::trainer;

namespace {

// A loss that falls slowly with ±5 % of deterministic wobble (the per-batch noise of a run).
double noisy_loss(int64_t step) { return (0.5 + 1.0 / double(step)) * (1.0 + 0.05 * std::sin(1.7 * double(step))); }

}  // namespace

TEST(HealthDetectors, MedianOfOddAndEvenCounts) {
  EXPECT_EQ(median_of({3, 1, 2}), 2);
  EXPECT_EQ(median_of({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(median_of({}), 0);
}

TEST(HealthDetectors, LossSpikeFlagsTheSpikeOnlyAndKeepsItOutOfTheWindow) {
  LossSpikeDetector d(/*window=*/50, /*threshold=*/8, /*ratio=*/2, /*warmup=*/20);
  for (int64_t s = 1; s <= 200; ++s) {
    const bool injected = s == 120 || s == 121;
    const double loss = injected ? 10 * noisy_loss(s) : noisy_loss(s);
    const auto v = d.observe(s, loss);
    EXPECT_EQ(v.spike, injected) << "step " << s << " loss " << loss << " median " << v.median << " z " << v.z;
    if (injected) {
      EXPECT_NEAR(v.median, noisy_loss(s), 0.05);  // the first spike did not enter the window
      EXPECT_GT(v.z, 8);
    }
  }
}

TEST(HealthDetectors, LossSpikeNeedsWarmupHistoryAndRatio) {
  LossSpikeDetector d(50, 8, 2, /*warmup=*/100);
  for (int64_t s = 1; s <= 100; ++s) EXPECT_FALSE(d.observe(s, s == 60 ? 100.0 : 1.0).spike) << s;  // warm-up
  LossSpikeDetector e(50, 8, 2, 0);
  for (int64_t s = 1; s <= 10; ++s) EXPECT_FALSE(e.observe(s, s == 10 ? 100.0 : 1.0).spike);  // < 20 losses seen
  // A constant window (MAD 0): +50 % is a huge z but below the 2× ratio, so not a spike; 3× is.
  LossSpikeDetector f(50, 8, 2, 0);
  for (int64_t s = 1; s <= 40; ++s) f.observe(s, 1.0);
  EXPECT_FALSE(f.observe(41, 1.5).spike);
  EXPECT_TRUE(f.observe(42, 3.0).spike);
  EXPECT_FALSE(f.observe(43, std::nan("")).spike);  // the non-finite check owns NaN
}

TEST(HealthDetectors, MemoryGrowthReadsTheRateAndIgnoresStartUpAndNoise) {
  GrowthTrend leak(/*window=*/1000, /*threshold=*/100, /*warmup=*/0);
  GrowthTrend::Verdict first;
  for (int64_t s = 50; s <= 2000; s += 50) {
    // 0.5 MiB per step = 500 MiB per 1k steps, with ±20 MiB of sampling noise.
    const auto v = leak.observe(s, 800 + 0.5 * double(s) + 10 * std::sin(double(s)));
    if (v.growing && first.since_step == 0) first = v;
  }
  ASSERT_GT(first.since_step, 0) << "a 500 MiB/1k leak was not reported";
  EXPECT_NEAR(first.mib_per_1k_steps, 500, 50);

  GrowthTrend flat(1000, 100, /*warmup=*/200);
  for (int64_t s = 50; s <= 3000; s += 50) {
    // A start-up climb of 300 MiB in the first 150 steps, then flat with noise.
    const double mib = s <= 150 ? 700 + 2.0 * double(s) : 1000 + 20 * std::sin(double(s));
    EXPECT_FALSE(flat.observe(s, mib).growing) << "step " << s;
  }
}

TEST(HealthDetectors, ThroughputCliffNamesWhereItStartedOnceAndRearms) {
  // The issue's own symptom: 0.62 → 0.70 s per step (+13 %), against the default drop of 10 %.
  ThroughputWatch w(/*drop=*/0.1, /*patience=*/3, /*warmup=*/100);
  int cliffs = 0;
  for (int64_t first = 0; first < 2000; first += 50) {
    const bool slow = (first >= 1000 && first < 1400) || first >= 1700;
    const double t = (slow ? 0.70 : 0.62) * (1 + 0.01 * std::sin(double(first)));
    const auto v = w.observe(first, t);
    if (!v.cliff) continue;
    ++cliffs;
    EXPECT_EQ(v.started_at_step, cliffs == 1 ? 1001 : 1701);
    EXPECT_NEAR(v.median_s, 0.62, 0.02);
    EXPECT_NEAR(v.recent_s, 0.70, 0.01);
  }
  EXPECT_EQ(cliffs, 2);  // once per cliff, re-armed by the normal intervals between them
}

TEST(HealthDetectors, StragglerIsFoundByBusyTimeNotStepTime) {
  // Synchronous training: every rank's step takes 1.0 s; rank 2 computes 0.9 s, the others 0.3 s
  // and wait 0.6 s for it in collectives.
  std::vector<RankTimes> ranks(4, RankTimes{1.0, 0.05, 0.6});
  ranks[2] = {1.0, 0.05, 0.05};
  const StragglerReport r = find_stragglers(ranks, 1.5);
  ASSERT_EQ(r.stragglers.size(), 1u);
  EXPECT_EQ(r.stragglers[0].rank, 2);
  EXPECT_EQ(r.stragglers[0].phase, "compute");
  EXPECT_NEAR(r.stragglers[0].busy_s, 0.95, 1e-12);
  EXPECT_NEAR(r.stragglers[0].median_busy_s, 0.4, 1e-12);
  EXPECT_EQ(r.step_s.min, 1.0);
  EXPECT_EQ(r.step_s.max, 1.0);
  EXPECT_NEAR(r.comm_s.median, 0.6, 1e-12);

  // A slow data worker on rank 1: its data wait is what is slow.
  std::vector<RankTimes> data(2, RankTimes{1.0, 0.02, 0.6});
  data[1] = {1.0, 0.62, 0.0};
  data.push_back(RankTimes{1.0, 0.02, 0.6});
  const StragglerReport d = find_stragglers(data, 1.5);
  ASSERT_EQ(d.stragglers.size(), 1u);
  EXPECT_EQ(d.stragglers[0].rank, 1);
  EXPECT_EQ(d.stragglers[0].phase, "data loading");

  // Balanced ranks: nobody named.
  EXPECT_TRUE(find_stragglers(std::vector<RankTimes>(8, RankTimes{1.0, 0.1, 0.2}), 1.5).stragglers.empty());
}

TEST(HealthDetectors, BatchOrdinalsParseSinglesAndRanges) {
  const auto set = parse_batch_ordinals({"12", "40-42", "41"}, "data.skip_batches");
  EXPECT_EQ(set, (std::set<int64_t>{12, 40, 41, 42}));
  for (const char* bad : {"0", "x", "5-3", "-4", "3-", "1.5"})
    EXPECT_THROW(parse_batch_ordinals({bad}, "data.skip_batches"), ConfigError) << bad;
  try {
    parse_batch_ordinals({"7-2"}, "data.skip_batches");
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'data.skip_batches'"), std::string::npos) << e.what();
  }
}

TEST(HealthDetectors, BlocksAreListEntriesOrTopLevelModules) {
  EXPECT_EQ(block_of("blocks.3.attn.qkv.weight"), "blocks.3");
  EXPECT_EQ(block_of("double_blocks.0.img_attn.qkv.weight"), "double_blocks.0");
  EXPECT_EQ(block_of("single_blocks.12.linear1.bias"), "single_blocks.12");
  EXPECT_EQ(block_of("t_embedder.mlp.0.weight"), "t_embedder");
  EXPECT_EQ(block_of("final_layer.adaLN_modulation.1.weight"), "final_layer");
  EXPECT_EQ(block_of("pos_embed"), "pos_embed");
  const auto sums = block_sq_norms({{"blocks.0.a", 1.0}, {"blocks.0.b", 2.0}, {"x_embedder.proj.weight", 4.0}});
  EXPECT_EQ(sums.at("blocks.0"), 3.0);
  EXPECT_EQ(sums.at("x_embedder"), 4.0);
}

TEST(HealthDetectors, NonFiniteGradientsAreNamedFromTheEndNearestTheFault) {
  EXPECT_EQ(describe_nonfinite_gradients({}, 7), "");
  EXPECT_EQ(describe_nonfinite_gradients({"blocks.0.attn.qkv.weight"}, 7),
            "non-finite gradient in 1 of 7 parameters: blocks.0.attn.qkv.weight");
  const std::vector<std::string> three = {"x_embedder.proj.weight", "blocks.0.mlp.fc1.weight", "blocks.1.attn.qkv.weight"};
  EXPECT_EQ(describe_nonfinite_gradients(three, 9),
            "non-finite gradients in 3 of 9 parameters; the last in forward order, nearest where backward went "
            "non-finite: blocks.1.attn.qkv.weight (the first: x_embedder.proj.weight)");
}

TEST(HealthDetectors, ABackwardNanReachesEveryParameterBeforeItInForwardOrder) {
  // The rule describe_nonfinite_gradients relies on, in real autograd: three layers, a NaN put
  // into the gradient arriving at layer 2's output. Layer 3 (after it) stays finite; layers 1
  // and 2 go non-finite, so the last non-finite one in forward order is layer 2.
  at::manual_seed(0);
  const std::vector<std::string> names = {"layer1.weight", "layer2.weight", "layer3.weight"};
  std::vector<at::Tensor> w;
  for (int i = 0; i < 3; ++i) w.push_back(at::randn({4, 4}, at::kDouble).set_requires_grad(true));
  at::Tensor h = at::relu(at::matmul(at::randn({2, 4}, at::kDouble), w[0]));
  h = at::matmul(h, w[1]);
  h.register_hook([](at::Tensor g) {
    return g.index_fill(1, at::zeros({1}, at::kLong), std::numeric_limits<double>::quiet_NaN());
  });
  at::matmul(at::relu(h), w[2]).sum().backward();
  std::vector<std::string> nonfinite;
  for (size_t i = 0; i < w.size(); ++i)
    if (!at::isfinite(w[i].grad()).all().item<bool>()) nonfinite.push_back(names[i]);
  ASSERT_EQ(nonfinite, (std::vector<std::string>{"layer1.weight", "layer2.weight"}));
  EXPECT_NE(describe_nonfinite_gradients(nonfinite, 3).find("non-finite: layer2.weight (the first: layer1.weight)"),
            std::string::npos);
}
