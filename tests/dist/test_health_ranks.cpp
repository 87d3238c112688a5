// Training health across ranks (flowtrain launch, 2 processes on Gloo): a NaN put into one
// rank's gradient is traced to that rank and parameter although the reduction spread it to
// every rank; a slowed rank is named as the straggler by its busy time and phase, and
// metrics.jsonl carries the per-rank spread.
#include "cli_runner.h"
#include "rank_runner.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <regex>

using namespace flowtrain::test;

TEST(DistHealth, NanOnOneRankIsNamedWithItsRankAndParameter) {
  REQUIRE_DATA();
  const std::string run = scratch_dir("dist_health_nan") + "/run";
  const auto r = run_flowtrain("launch --nproc-per-node 2 -- " +
                               tiny_train_args(run, {"train.steps=6", "train.threads=1", "data.workers=1",
                                                     "debug.allow_inject=true", "debug.inject.nan_grad_step=3",
                                                     "debug.inject.nan_grad_rank=1"}));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("health: non-finite gradient at step 3 (batch #3) on rank 1 ("), std::string::npos)
      << r.output;
  // Only that parameter: the MAX over ranks joins the flags of one parameter, not its neighbours.
  EXPECT_TRUE(std::regex_search(r.output,
                                std::regex("non-finite gradient in 1 of \\d+ parameters: blocks\\.0\\.attn\\.qkv\\.weight")))
      << r.output;
  EXPECT_EQ(r.output.find("on rank 0"), std::string::npos) << r.output;  // rank 0's own gradients were finite
}

TEST(DistHealth, SlowRankIsNamedAsTheStragglerWithItsPhase) {
  REQUIRE_DATA();
  const std::string run = scratch_dir("dist_health_straggler") + "/run";
  const auto r = run_flowtrain("launch --nproc-per-node 2 -- " +
                               // With 2 ranks the median is their mean, so rank 1 must be busy 3× rank 0
                               // to reach ratio 1.5: 0.6 s against ~0.03–0.1 s (tests run in parallel).
                               tiny_train_args(run, {"train.steps=6", "train.log_every=3", "train.threads=1",
                                                     "data.workers=1", "debug.allow_inject=true",
                                                     "debug.inject.slow_rank=1", "debug.inject.slow_seconds=0.6"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m,
                                std::regex("health: straggler over steps \\d+–\\d+: rank (\\d) \\(([^)]+)\\) is busy "
                                           "([0-9.]+) s per step against the median rank's ([0-9.]+) s")))
      << r.output;
  EXPECT_EQ(m[1].str(), "1");
  EXPECT_GE(std::stod(m[3].str()), 0.6);  // its injected 0.6 s is busy time, not waiting
  EXPECT_NE(r.output.find("slow phase: compute"), std::string::npos) << r.output;
  const auto rows = read_metric_rows(run, "rank_compute_s_max");
  ASSERT_FALSE(rows.empty());
  const auto& last = rows.back();
  EXPECT_GE(last["rank_compute_s_max"].get<double>(), 0.6);
  // Both ranks' steps take as long (the fast one waits in collectives): the wait is on rank 0.
  EXPECT_NEAR(last["rank_step_time_s_min"].get<double>(), last["rank_step_time_s_max"].get<double>(),
              0.25 * last["rank_step_time_s_max"].get<double>());
  EXPECT_GE(last["rank_comm_wait_s_max"].get<double>(), 0.3);  // most of the 0.6 s
}

TEST(DistHealth, BlockTelemetryUnderFsdpEqualsOneProcess) {
  REQUIRE_DATA();
  const std::string one = scratch_dir("dist_telemetry_one") + "/run", two = scratch_dir("dist_telemetry_two") + "/run";
  const std::vector<std::string> sets = {"train.steps=2", "health.telemetry_every=2", "train.threads=1",
                                         "data.workers=1"};
  ASSERT_EQ(run_flowtrain(tiny_train_args(one, sets)).exit_code, 0);
  const auto r = run_flowtrain("launch --nproc-per-node 2 -- " + tiny_train_args(two, sets));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto a = read_metric_rows(one, "grad_norm/blocks.0"), b = read_metric_rows(two, "grad_norm/blocks.0");
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  int compared = 0;
  for (const auto& [key, value] : a[0].items()) {
    if (key == "step") continue;
    ASSERT_TRUE(b[0].contains(key)) << key;
    // FSDP reduces gradients in another order (fp32): equal to ~1e-6 relative, like its losses.
    EXPECT_NEAR(b[0][key].get<double>(), value.get<double>(), 1e-4 * std::abs(value.get<double>()) + 1e-9) << key;
    ++compared;
  }
  EXPECT_GE(compared, 6 + 4);  // 6 blocks' gradient norms, and the update ratios of (at least) the non-zero ones
}

TEST(DistHealth, RollbackOnTwoRanksContinuesAsARunThatNeverSawTheBatch) {
  REQUIRE_DATA();
  const std::string a = scratch_dir("dist_rollback") + "/run", b = scratch_dir("dist_never_saw") + "/run";
  const std::vector<std::string> common = {"train.steps=10", "checkpoint.every=4", "train.threads=1", "data.workers=1"};
  std::vector<std::string> sets = common;
  for (const char* s : {"health.nonfinite=rollback", "debug.allow_inject=true", "debug.inject.nan_grad_step=6",
                        "debug.inject.nan_grad_rank=1"})
    sets.push_back(s);
  const auto ra = run_flowtrain("launch --nproc-per-node 2 -- " + tiny_train_args(a, sets));
  ASSERT_EQ(ra.exit_code, 0) << ra.output;
  EXPECT_NE(ra.output.find("batch #6 will be discarded"), std::string::npos) << ra.output;
  sets = common;
  sets.push_back("data.skip_batches=[\"6\"]");
  ASSERT_EQ(run_flowtrain("launch --nproc-per-node 2 -- " + tiny_train_args(b, sets)).exit_code, 0);
  const auto la = read_metrics(a), lb = read_metrics(b);
  std::map<int64_t, double> last_a, last_b;  // the last row of each step (the replayed ones were rewritten)
  for (const auto& row : la) last_a[row["step"].get<int64_t>()] = row["loss"].get<double>();
  for (const auto& row : lb) last_b[row["step"].get<int64_t>()] = row["loss"].get<double>();
  ASSERT_EQ(last_a.size(), 10u);
  for (int64_t s = 1; s <= 10; ++s) EXPECT_EQ(last_a.at(s), last_b.at(s)) << "step " << s;  // same computation
}

TEST(DistHealth, SpikeAndLeakAreFoundOnEveryRank) {
  REQUIRE_DATA();
  const std::string run = scratch_dir("dist_spike_leak") + "/run";
  const auto r = run_flowtrain(
      "launch --nproc-per-node 2 -- " +
      tiny_train_args(run, {"train.steps=40", "train.log_every=2", "train.threads=1", "data.workers=1",
                            "health.warmup_steps=10", "health.spike_window=20", "health.spike=skip",
                            "health.memory_window=20", "health.memory_growth_mib_per_1k=1000",
                            "debug.allow_inject=true", "debug.inject.spike_step=30", "debug.inject.spike_factor=20",
                            "debug.inject.leak_mib_per_step=4"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("health: loss spike at step 30 (batch #30)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the update is skipped (1 of health.max_skips 10)"), std::string::npos) << r.output;
  // Each rank fits its own memory and says so itself.
  EXPECT_NE(r.output.find("resident memory on rank 0 grows"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resident memory on rank 1 grows"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(run + "/health/spike-step-0000030-rank-00001.json"));
}
