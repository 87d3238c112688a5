// FSDP training across processes (Gloo on loopback) against the unsharded single-process run:
// the same global batch must give the same loss trajectory and the same final weights.
#include "cli_runner.h"
#include "equivalence.h"
#include "test_util.h"

#include "data/png.h"
#include "data/safetensors.h"
#include "trainer/checkpoint/checkpoint.h"

#include <filesystem>

namespace fs = std::filesystem;
using namespace flowtrain;
using namespace flowtrain::test;

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
  // Recomputed blocks under FSDP: the weights are re-gathered before the recompute.
  const std::string w2_ac = base + "/world2_activation_checkpointing";
  run_world(2, w2_ac, with({"train.activation_checkpointing=full"}));
  expect_equivalent(w1, w1_fsdp, "world 1 with FSDP on");
  expect_equivalent(w1, w2, "world 2 (dp_shard 2)");
  expect_equivalent(w1, w2_ac, "world 2 (dp_shard 2) with activation checkpointing");
  EXPECT_NE(read_file(w2_ac + "/log.txt").find("activation checkpointing: 2 of 2 blocks recomputed"), std::string::npos);
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

  // `checkpoint inspect` shows the mesh it was saved at and global shapes from the shard layout.
  r = run_flowtrain("checkpoint inspect " + final_checkpoint(straight));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("saved at world size 2: FSDP, 2 shards of"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.shard-00001-of-00002.safetensors"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("x_embedder.proj.weight  [64, 1, 4, 4]  unit "), std::string::npos) << r.output;

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

TEST(DistFsdp, ActivationCheckpointingInBf16MatchesTheRunThatStoresActivations) {
  // bf16 autocast: FSDP gathers bf16 weights, and the recompute (in backward, after the forward's
  // autocast region) must run under autocast again to compute the same function.
  REQUIRE_DATA();
  const std::string base = scratch_dir("ac_bf16");
  const std::string stored = base + "/stored", recomputed = base + "/recomputed";
  run_world(2, stored, with({"train.precision=bf16"}));
  run_world(2, recomputed, with({"train.precision=bf16", "train.activation_checkpointing=full"}));
  expect_equivalent(stored, recomputed, "world 2 bf16, activation checkpointing vs stored activations");
}

TEST(DistFsdp, SampleGridsFromTheShardedModelMatchTheSingleProcessOnes) {
  // Under FSDP the grid is integrated by the sharded model itself (EMA shards swapped in, one
  // unit gathered at a time, rows split over the data-parallel ranks) — no full copy on any rank.
  // It must show what the single-process EMA model draws: same noise, same labels, weights equal
  // to ~2e-5 (the equivalence above), 4 Euler steps.
  REQUIRE_DATA();
  const std::string base = scratch_dir("sharded_sampling");
  const std::vector<std::string> sets = with({"sample.every=20", "sample.num=20"});
  run_world(1, base + "/world1", sets);
  run_world(2, base + "/world2", sets);
  run_world(4, base + "/hsdp2x2", with({"sample.every=20", "sample.num=21", "parallel.dp_replicate=2"}));
  run_world(1, base + "/world1_21", with({"sample.every=20", "sample.num=21"}));
  // Context parallelism: both ranks of the context group integrate the same rows together.
  run_world(1, base + "/world1_patch2", with({"sample.every=20", "sample.num=20", "model.patch=2"}));
  run_world(2, base + "/cp2", with({"sample.every=20", "sample.num=20", "model.patch=2", "parallel.cp=2"}));
  for (const auto& [a, b] : {std::pair<std::string, std::string>{"world1", "world2"},
                             {"world1_21", "hsdp2x2"},
                             {"world1_patch2", "cp2"}}) {
    const at::Tensor ga = data::read_png(base + "/" + a + "/samples/step-0000020.png").to(at::kInt);
    const at::Tensor gb = data::read_png(base + "/" + b + "/samples/step-0000020.png").to(at::kInt);
    ASSERT_EQ(ga.sizes(), gb.sizes()) << a << " vs " << b;
    const at::Tensor diff = (ga - gb).abs();
    const double max = diff.max().item<double>(), mean = diff.to(at::kFloat).mean().item<double>();
    std::printf("[sampling] %s vs %s: 8-bit grid, max |diff| %.0f, mean %.4f\n", a.c_str(), b.c_str(), max, mean);
    // Weights ~2e-5 apart move a pixel by far less than one 8-bit level (1/127.5 of the [-1, 1]
    // range): the only possible differences are roundings that land on the other side of a
    // level (measured: none at all).
    EXPECT_LE(max, 1) << a << " vs " << b;
    EXPECT_LT(mean, 0.01) << a << " vs " << b;
  }
}
