// Training health through the CLI, one process: each detector against its injected fault
// (debug.inject.*) — the health: line names the step, rank and tensor — and each policy's effect:
// stop exits 1 with the last checkpoint intact, skip leaves that step's weights untouched and
// trains on finite, rollback continues exactly as a run that never saw the bad batch.
#include "cli_runner.h"
#include "data/safetensors.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <regex>

namespace fs = std::filesystem;
using namespace flowtrain::test;

namespace {

// The last metrics row of each step (a rollback rewrites the replayed steps' rows).
std::map<int64_t, double> losses_by_step(const std::string& run) {
  std::map<int64_t, double> out;
  for (const auto& row : read_metrics(run))
    if (row["loss"].is_number()) out[row["step"].get<int64_t>()] = row["loss"].get<double>();
  return out;
}

// Whether two checkpoint files hold the same tensors bit for bit (their metadata names the step).
bool same_tensors(const std::string& a, const std::string& b) {
  const auto ta = flowtrain::data::read_safetensors(a), tb = flowtrain::data::read_safetensors(b);
  if (ta.size() != tb.size()) return false;
  for (size_t i = 0; i < ta.size(); ++i)
    if (ta[i].first != tb[i].first || !ta[i].second.equal(tb[i].second)) return false;
  return true;
}

std::vector<std::string> inject(std::vector<std::string> sets) {
  sets.insert(sets.begin(), "debug.allow_inject=true");
  return sets;
}

}  // namespace

TEST(Health, InjectionIsRefusedUnlessAllowed) {
  const auto r = train_tiny(scratch_dir("health_refused") + "/run", {"debug.inject.nan_grad_step=3"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("'debug.allow_inject' is false"), std::string::npos) << r.output;
  const auto bad = train_tiny(scratch_dir("health_badparam") + "/run",
                              inject({"debug.inject.nan_grad_step=3", "debug.inject.nan_grad_param=no.such.weight"}));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("'no.such.weight' names no parameter"), std::string::npos) << bad.output;
}

TEST(Health, NonFiniteGradientStopsNamingStepRankAndParameter) {
  REQUIRE_DATA();
  const std::string run = scratch_dir("health_stop") + "/run";
  const auto r = train_tiny(run, inject({"train.steps=12", "checkpoint.every=4", "debug.inject.nan_grad_step=6"}));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("health: non-finite gradient at step 6 (batch #6) on rank 0: the loss is finite"),
            std::string::npos)
      << r.output;
  // The fault is put into that one gradient: one parameter named, with how many there are.
  EXPECT_TRUE(std::regex_search(r.output,
                                std::regex("non-finite gradient in 1 of \\d+ parameters: blocks\\.0\\.attn\\.qkv\\.weight")))
      << r.output;
  // The checkpoint before the fault is complete and nothing after it was written.
  EXPECT_TRUE(fs::exists(ckpt(run, 4) + "/manifest.json"));
  EXPECT_FALSE(fs::exists(ckpt(run, 8)));
  EXPECT_EQ(losses_by_step(run).rbegin()->first, 5);  // step 6 never logged as trained
}

TEST(Health, SkipLeavesTheStepsWeightsUntouchedAndTrainsOn) {
  REQUIRE_DATA();
  const std::string run = scratch_dir("health_skip") + "/run";
  const auto r = train_tiny(run, inject({"train.steps=9", "checkpoint.every=1", "health.nonfinite=skip",
                                         "debug.inject.nan_grad_step=6", "debug.inject.nan_grad_param=final_layer.linear.weight"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("non-finite gradient in 1 of \\d+ parameters: final_layer\\.linear\\.weight — "
                                                      "the update is skipped \\(1 of health\\.max_skips 10\\)")))
      << r.output;
  // Step 6 changed nothing: weights, EMA and AdamW of step 6 are those of step 5; step 7 moves on.
  for (const char* f : {"model.safetensors", "ema.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(same_tensors(ckpt(run, 5) + "/" + f, ckpt(run, 6) + "/" + f)) << f;
  EXPECT_FALSE(same_tensors(ckpt(run, 6) + "/model.safetensors", ckpt(run, 7) + "/model.safetensors"));
  const auto losses = losses_by_step(run);
  for (int64_t s : {7, 8, 9}) EXPECT_TRUE(std::isfinite(losses.at(s))) << s;
  EXPECT_EQ(read_metrics(run).back()["health_skipped_updates"].get<double>(), 1.0);
}

TEST(Health, SkipStopsOnceMaxSkipsIsSpent) {
  REQUIRE_DATA();
  const auto r = train_tiny(scratch_dir("health_maxskip") + "/run",
                            inject({"train.steps=8", "health.nonfinite=skip", "health.max_skips=0",
                                    "debug.inject.nan_grad_step=3"}));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("stopping: health.max_skips (0) updates already skipped"), std::string::npos) << r.output;
}

TEST(Health, RollbackContinuesAsARunThatNeverSawTheBadBatch) {
  REQUIRE_DATA();
  const std::string a = scratch_dir("health_rollback") + "/run", b = scratch_dir("health_never_saw") + "/run";
  const auto ra = train_tiny(a, inject({"train.steps=12", "checkpoint.every=4", "health.nonfinite=rollback",
                                        "debug.inject.nan_grad_step=6"}));
  ASSERT_EQ(ra.exit_code, 0) << ra.output;
  EXPECT_NE(ra.output.find("rolled back from step 6 to " + ckpt(a, 4) + " (step 4); batch #6 will be discarded"),
            std::string::npos)
      << ra.output;
  // The reference: the same run told to discard batch #6 up front, never faulted.
  const auto rb = train_tiny(b, {"train.steps=12", "checkpoint.every=4", "data.skip_batches=[\"6\"]"});
  ASSERT_EQ(rb.exit_code, 0) << rb.output;
  const auto la = losses_by_step(a), lb = losses_by_step(b);
  ASSERT_EQ(la.size(), 12u);
  for (int64_t s = 1; s <= 12; ++s) EXPECT_EQ(la.at(s), lb.at(s)) << "step " << s;  // same computation: bit-equal
  for (const char* f : {"model.safetensors", "ema.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(same_tensors(ckpt(a, 12) + "/" + f, ckpt(b, 12) + "/" + f)) << f;
  // The events file tells the story.
  const std::string events = read_file(a + "/health/events.jsonl");
  EXPECT_NE(events.find("\"kind\":\"rollback\""), std::string::npos) << events;
  EXPECT_NE(events.find("\"kind\":\"rollback_done\""), std::string::npos) << events;
}

TEST(Health, RollbackWithoutACheckpointStops) {
  REQUIRE_DATA();
  const auto r = train_tiny(scratch_dir("health_nockpt") + "/run",
                            inject({"train.steps=8", "checkpoint.every=0", "health.nonfinite=rollback",
                                    "debug.inject.nan_grad_step=3"}));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("rollback at step 3 needs a checkpoint"), std::string::npos) << r.output;
}

TEST(Health, LossSpikeIsFlaggedWithItsSamplesAndSkipped) {
  REQUIRE_DATA();
  const std::string run = scratch_dir("health_spike") + "/run";
  const auto r = train_tiny(run, inject({"train.steps=40", "checkpoint.every=1", "checkpoint.keep=0", "health.spike=skip",
                                         "health.warmup_steps=10", "health.spike_window=20",
                                         "debug.inject.spike_step=30", "debug.inject.spike_factor=20"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::smatch m;
  const std::regex spike_line("health: loss spike at step (\\d+) \\(batch #(\\d+)\\)");
  ASSERT_TRUE(std::regex_search(r.output, m, spike_line)) << r.output;
  EXPECT_EQ(m[1].str(), "30");  // the injected step, and no other (the tiny run's ordinary noise is not a spike)
  EXPECT_EQ(r.output.find("health: loss spike", m.position(0) + 1), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the update is skipped"), std::string::npos) << r.output;
  EXPECT_TRUE(same_tensors(ckpt(run, 29) + "/model.safetensors", ckpt(run, 30) + "/model.safetensors"));
  // Per-sample losses of the spiking batch: 32 rows, each scaled like the batch's loss.
  const auto j = nlohmann::json::parse(read_file(run + "/health/spike-step-0000030-rank-00000.json"));
  EXPECT_EQ(j["samples"].size(), 32u);
  double mean = 0;
  for (const auto& row : j["samples"]) mean += row["loss"].get<double>() / 32;
  EXPECT_NEAR(mean, j["loss"].get<double>(), 1e-4 * j["loss"].get<double>());  // mean of equal-size samples = the loss
  EXPECT_GT(j["loss"].get<double>(), 5 * j["window_median"].get<double>());
}

TEST(Health, MemoryLeakIsReportedWithItsRate) {
  REQUIRE_DATA();
  const auto r = train_tiny(scratch_dir("health_leak") + "/run",
                            inject({"train.steps=40", "train.log_every=2", "health.warmup_steps=4",
                                    "health.memory_window=20", "health.memory_growth_mib_per_1k=1000",
                                    "debug.inject.leak_mib_per_step=4"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex("resident memory on rank 0 grows (\\d+) MiB per 1k steps")))
      << r.output;
  // 4 MiB a step is 4,000 MiB per 1k steps; the allocator's own churn moves a 20-step fit a little.
  EXPECT_NEAR(std::stod(m[1].str()), 4000, 800) << m[0];
}

TEST(Health, ThroughputDropNamesItsStartAndWhatCameBefore) {
  REQUIRE_DATA();
  const auto r = train_tiny(scratch_dir("health_cliff") + "/run",
                            inject({"train.steps=36", "train.log_every=2", "health.warmup_steps=10",
                                    "health.throughput_patience=3", "sample.every=28", "sample.num=4",
                                    // One intra-op thread: with two, a process busy on one of the two
                                    // cores stalls every parallel region on the descheduled thread
                                    // (steps 25-28 of a 0.028 s median took 0.28-0.33 s beside a training run,
                                    // so the drop was dated from step 25). One thread shares its core
                                    // at worst.
                                    "train.threads=1",
                                    // A drop of +300 %: tests run two at a time, and the other one's
                                    // load moves this tiny run's ~0.03 s steps by up to +140 %; the
                                    // injected 0.5 s per step is +800 % or more.
                                    "health.throughput_drop=3", "debug.inject.slow_seconds=0.5",
                                    // Both steps of the interval (28, 30] slowed, so that interval alone
                                    // clears the bar even when the other test's load triples the median.
                                    "debug.inject.slow_from_step=29"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Step 29 is the first slowed one, the first of log interval (28, 30], right after the grid.
  EXPECT_NE(r.output.find("since step 29 against the run's median"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("just before: sample grid at step 28"), std::string::npos) << r.output;
}

TEST(Health, BlockTelemetryAddsUpToTheGlobalNorm) {
  REQUIRE_DATA();
  const std::string run = scratch_dir("health_telemetry") + "/run";
  const auto r = train_tiny(run, {"train.steps=4", "health.telemetry_every=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = read_metric_rows(run, "grad_norm/blocks.0");
  ASSERT_EQ(rows.size(), 2u);  // steps 2 and 4
  const auto losses = read_metrics(run);
  for (const auto& row : rows) {
    const int64_t step = row["step"].get<int64_t>();
    double sq = 0;
    int blocks = 0;
    for (const auto& [key, value] : row.items()) {
      if (key.rfind("grad_norm/", 0) == 0) {
        sq += value.get<double>() * value.get<double>();
        ++blocks;
      }
      if (key.rfind("update_ratio/blocks.", 0) == 0) {
        EXPECT_GT(value.get<double>(), 0) << key;     // every transformer block moved…
        EXPECT_LT(value.get<double>(), 0.1) << key;   // …by a small fraction of itself at lr 2e-3
      }
    }
    EXPECT_EQ(blocks, 6) << row.dump();  // x/t/y embedders, blocks.0, blocks.1, final_layer
    // The blocks' norms are taken after the global clip to 1.0 (which scales all alike).
    double logged = 0;
    for (const auto& m : losses)
      if (m["step"].get<int64_t>() == step) logged = m["grad_norm"].get<double>();
    const double clipped = logged * std::min(1.0, 1.0 / (logged + 1e-6));
    EXPECT_NEAR(std::sqrt(sq), clipped, 1e-4 * clipped) << "step " << step;  // fp32 sums in another order
  }
}

TEST(Health, LossSpikeWarnTrainsOnTheBatchAndRollbackContinuesPastIt) {
  REQUIRE_DATA();
  const std::vector<std::string> spike = {"health.warmup_steps=10", "health.spike_window=20",
                                          "debug.inject.spike_step=30", "debug.inject.spike_factor=20"};
  // warn: said, and the update applied (the weights move at step 30 as at any step).
  const std::string warn = scratch_dir("health_spike_warn") + "/run";
  std::vector<std::string> sets = inject(spike);
  for (const char* s : {"train.steps=31", "checkpoint.every=1", "checkpoint.keep=0", "health.spike=warn"}) sets.push_back(s);
  const auto rw = train_tiny(warn, sets);
  ASSERT_EQ(rw.exit_code, 0) << rw.output;
  EXPECT_NE(rw.output.find("health: loss spike at step 30 (batch #30)"), std::string::npos) << rw.output;
  EXPECT_NE(rw.output.find("training goes on (health.spike: warn)"), std::string::npos) << rw.output;
  EXPECT_FALSE(same_tensors(ckpt(warn, 29) + "/model.safetensors", ckpt(warn, 30) + "/model.safetensors"));
  // rollback: continues as the run told to discard batch #30 from the start.
  const std::string a = scratch_dir("health_spike_rollback") + "/run", b = scratch_dir("health_spike_never") + "/run";
  sets = inject(spike);
  for (const char* s : {"train.steps=34", "checkpoint.every=8", "health.spike=rollback"}) sets.push_back(s);
  const auto ra = train_tiny(a, sets);
  ASSERT_EQ(ra.exit_code, 0) << ra.output;
  EXPECT_NE(ra.output.find("rolled back from step 30 to " + ckpt(a, 24) + " (step 24); batch #30 will be discarded"),
            std::string::npos)
      << ra.output;
  ASSERT_EQ(train_tiny(b, {"train.steps=34", "checkpoint.every=8", "data.skip_batches=[\"30\"]"}).exit_code, 0);
  const auto la = losses_by_step(a), lb = losses_by_step(b);
  for (int64_t s = 25; s <= 34; ++s) EXPECT_EQ(la.at(s), lb.at(s)) << "step " << s;
  EXPECT_TRUE(same_tensors(ckpt(a, 34) + "/model.safetensors", ckpt(b, 34) + "/model.safetensors"));
}

TEST(Health, SlowDataWorkerIsChargedToTheDataWait) {
  REQUIRE_DATA();
  const std::string run = scratch_dir("health_slow_worker") + "/run";
  const auto r = train_tiny(run, inject({"train.steps=4", "debug.inject.slow_worker_seconds=0.3"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const auto& row : read_metrics(run))
    EXPECT_GE(row["data_wait_s"].get<double>(), 0.3) << row.dump();  // every step waits for its late batch
}
