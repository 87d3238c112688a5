// FSDP training across processes (Gloo on loopback) against the unsharded single-process run:
// the same global batch must give the same loss trajectory and the same final weights.
#include "cli_runner.h"
#include "rank_runner.h"
#include "test_util.h"

#include "data/safetensors.h"
#include "trainer/checkpoint.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>

namespace fs = std::filesystem;
using namespace flowtrain;
using namespace flowtrain::test;

namespace {


// 20 logged steps, final checkpoint, one intra-op thread per rank (4 ranks share 2 cores).
const std::vector<std::string> kCommon = {"train.steps=20", "train.log_every=1", "train.threads=1", "data.workers=1",
                                          "checkpoint.every=0", "train.tensorboard=false"};

std::vector<std::string> with(std::vector<std::string> extra) {
  std::vector<std::string> all = kCommon;
  all.insert(all.end(), extra.begin(), extra.end());
  return all;
}

std::string final_checkpoint(const std::string& run) { return run + "/checkpoints/step-0000020"; }

void run_world(int world, const std::string& run, const std::vector<std::string>& sets) {
  if (world == 1) {
    auto r = train_tiny(run, sets);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    return;
  }
  RankJob job;
  job.world = world;
  job.args = tiny_train_args(run, sets);
  job.log_dir = fs::path(run).parent_path().string();
  job.deadline = std::chrono::seconds(240);
  auto results = run_ranks(job);
  for (int r = 0; r < world; ++r) ASSERT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
}

struct Difference {
  double loss_rel = 0, weight_abs = 0, ema_abs = 0;
};

// Largest per-step relative loss difference and largest final weight / EMA difference.
Difference compare_runs(const std::string& a, const std::string& b) {
  Difference d;
  auto ma = read_metrics(a), mb = read_metrics(b);
  EXPECT_EQ(ma.size(), mb.size());
  for (size_t i = 0; i < std::min(ma.size(), mb.size()); ++i) {
    const double la = ma[i]["loss"].get<double>(), lb = mb[i]["loss"].get<double>();
    d.loss_rel = std::max(d.loss_rel, std::abs(la - lb) / std::abs(la));
  }
  auto ca = trainer::load_checkpoint(final_checkpoint(a)), cb = trainer::load_checkpoint(final_checkpoint(b));
  auto max_diff = [](const trainer::NamedTensors& x, const trainer::NamedTensors& y) {
    EXPECT_EQ(x.size(), y.size());
    double m = 0;
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
      EXPECT_EQ(x[i].first, y[i].first);
      EXPECT_EQ(x[i].second.sizes(), y[i].second.sizes()) << x[i].first;
      m = std::max(m, (x[i].second - y[i].second).abs().max().item<double>());
    }
    return m;
  };
  d.weight_abs = max_diff(ca.model, cb.model);
  d.ema_abs = max_diff(ca.ema, cb.ema);
  return d;
}

// Tolerances. The sharded runs do the same fp32 arithmetic in another order: each rank's loss
// is the mean over its own slice of the batch (then averaged), gradients are summed across
// ranks by the reduce-scatter, the grad norm is a sum of per-shard sums. Each reordering
// changes a result by a few ulps (~1e-7 relative); Adam then normalises every update to
// ~lr per element, so a tiny gradient difference changes a weight by at most ~lr × (relative
// change of m/√v), and over 20 steps these stay far below 1e-4 absolute (weights are O(0.1)).
// A real bug (a missing shard, a wrong average, a skipped micro-batch) moves losses by >1e-3
// relative and weights by >1e-3 absolute within a few steps, which these bounds would catch.
constexpr double kLossRelTol = 1e-5;
constexpr double kWeightAbsTol = 1e-4;

void expect_equivalent(const std::string& reference, const std::string& run, const char* what) {
  Difference d = compare_runs(reference, run);
  std::printf("[equivalence] %s: max loss rel diff %.3g, max weight abs diff %.3g, max EMA abs diff %.3g\n", what,
              d.loss_rel, d.weight_abs, d.ema_abs);
  EXPECT_LE(d.loss_rel, kLossRelTol) << what;
  EXPECT_LE(d.weight_abs, kWeightAbsTol) << what;
  EXPECT_LE(d.ema_abs, kWeightAbsTol) << what;
}

int64_t peak_state_bytes(const std::string& run, int rank) {
  auto j = nlohmann::json::parse(read_file(run + "/ranks/rank-" + std::string(5 - std::to_string(rank).size(), '0') +
                                           std::to_string(rank) + ".json"));
  return j["peak_state_bytes"].get<int64_t>();
}

}  // namespace

TEST(DistFsdp, ShardedRunsMatchTheUnshardedRunFor20Steps) {
  REQUIRE_DATA();
  const std::string base = scratch_dir("equivalence");
  const std::string w1 = base + "/world1", w2 = base + "/world2", w4 = base + "/world4", hsdp = base + "/hsdp2x2";
  const std::string w1_fsdp = base + "/world1_fsdp";
  run_world(1, w1, kCommon);
  run_world(1, w1_fsdp, with({"parallel.fsdp=on"}));  // FSDP machinery on a group of one
  run_world(2, w2, kCommon);
  run_world(4, w4, kCommon);
  run_world(4, hsdp, with({"parallel.dp_replicate=2"}));
  expect_equivalent(w1, w1_fsdp, "world 1 with FSDP on");
  expect_equivalent(w1, w2, "world 2 (dp_shard 2)");
  expect_equivalent(w1, w4, "world 4 (dp_shard 4)");
  expect_equivalent(w1, hsdp, "world 4 (HSDP dp_replicate 2 x dp_shard 2)");

  // Memory: each of 4 ranks holds a quarter of the weights, gradients, AdamW moments and EMA.
  // The unsharded run also counts the fixed pos_embed table (49×64 of ~0.18M numbers) and the
  // shards carry up to 3 elements of padding per unit, so the ratio is just under 1/4.
  const int64_t whole = peak_state_bytes(w1, 0);
  for (int r = 0; r < 4; ++r) {
    const double ratio = double(peak_state_bytes(w4, r)) / double(whole);
    std::printf("[memory] world 4 rank %d: %lld bytes of training state, %.4f of world 1 (%lld)\n", r,
                static_cast<long long>(peak_state_bytes(w4, r)), ratio, static_cast<long long>(whole));
    EXPECT_GT(ratio, 0.24);
    EXPECT_LT(ratio, 0.251);
  }
}

TEST(DistFsdp, GradientAccumulationWithAndWithoutPerMicroBatchReduction) {
  REQUIRE_DATA();
  const std::string base = scratch_dir("accumulation");
  const std::string w1 = base + "/world1", lazy = base + "/accum_reduce_last", eager = base + "/accum_reduce_every";
  run_world(1, w1, kCommon);
  // Same global batch of 32: 2 ranks × 2 micro-batches × 8.
  run_world(2, lazy, with({"train.grad_accum=2"}));
  run_world(2, eager, with({"train.grad_accum=2", "parallel.reduce_every_micro_batch=true"}));
  expect_equivalent(w1, lazy, "world 2, grad_accum 2, reduce on the last micro-batch");
  expect_equivalent(w1, eager, "world 2, grad_accum 2, reduce every micro-batch");
}

TEST(DistFsdp, ResumeAtTheSameWorldSizeIsExactAndExportConsolidates) {
  REQUIRE_DATA();
  const std::string base = scratch_dir("resume");
  const std::string straight = base + "/straight", resumed = base + "/resumed";
  run_world(2, straight, kCommon);
  run_world(2, resumed, with({"train.steps=10"}));
  run_world(2, resumed, kCommon);  // resumes from step 10
  // Bit for bit: every shard file of the final checkpoint is identical.
  for (const auto& entry : fs::directory_iterator(final_checkpoint(straight))) {
    const std::string name = entry.path().filename().string();
    if (name == "manifest.json") continue;
    EXPECT_EQ(read_file(entry.path().string()), read_file(final_checkpoint(resumed) + "/" + name)) << name;
  }
  auto a = read_metrics(straight), b = read_metrics(resumed);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]["loss"], b[i]["loss"]) << "step " << i + 1;

  // Export: one consolidated file with the reference key names, equal to the consolidated load.
  const std::string out = base + "/export.safetensors";
  auto r = run_flowtrain("export --checkpoint " + final_checkpoint(straight) + " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto full = trainer::load_checkpoint(final_checkpoint(straight));
  auto exported = data::read_safetensors(out);
  ASSERT_EQ(exported.size(), full.model.size());
  for (size_t i = 0; i < exported.size(); ++i) {
    EXPECT_EQ(exported[i].first, full.model[i].first);
    EXPECT_TRUE(exported[i].second.equal(full.model[i].second)) << exported[i].first;
  }
  // PyTorch's state_dict order: a module's own parameters (DiT.pos_embed), then its children's.
  EXPECT_EQ(exported[0].first, "pos_embed");
  EXPECT_EQ(exported[1].first, "x_embedder.proj.weight");
  EXPECT_EQ(exported.back().first, "final_layer.adaLN_modulation.1.bias");

  // Sampling reads a sharded checkpoint like any other (consolidated EMA weights).
  r = run_flowtrain("sample -c " + source_path("tests/configs/tiny_fashion.yaml") + " --checkpoint " +
                    final_checkpoint(straight) + " --out " + base + "/grid.png");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(base + "/grid.png"));
}

TEST(DistFsdp, ResumeAtAnotherWorldSizeReshardsTheCheckpoint) {
  REQUIRE_DATA();
  const std::string base = scratch_dir("reshard");
  const std::string w1 = base + "/world1", moved = base + "/moved";
  run_world(1, w1, kCommon);
  run_world(2, moved, with({"train.steps=10"}));
  run_world(4, moved, kCommon);  // 2 shards on disk, 4 ranks now
  expect_equivalent(w1, moved, "10 steps at world 2, resumed for 10 at world 4");
}
