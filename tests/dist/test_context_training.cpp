// Context-parallel training across processes (Gloo on loopback) against the single-process run:
// the sequence of every sample split over cp ranks must give the same losses and final weights
// as the unsplit model, with Ulysses and ring attention, alone and combined with FSDP sharding.
#include "cli_runner.h"
#include "equivalence.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <cstdio>

using namespace flowtrain::test;

namespace {

// The tiny config at patch 2: (28/2)² = 196 tokens split evenly over 2 and 4 ranks; 2 heads.
std::vector<std::string> cp_run(std::vector<std::string> extra) {
  extra.insert(extra.begin(), "model.patch=2");
  return with(std::move(extra));
}

}  // namespace

TEST(DistContext, ContextParallelRunsMatchTheSingleProcessRunFor20Steps) {
  REQUIRE_DATA();
  const std::string base = scratch_dir("context_parallel");
  const std::string w1 = base + "/world1";
  run_world(1, w1, cp_run({}));

  run_world(2, base + "/cp2_ulysses", cp_run({"parallel.cp=2", "parallel.cp_attention=ulysses"}));
  expect_equivalent(w1, base + "/cp2_ulysses", "cp 2, Ulysses");
  run_world(2, base + "/cp2_ring", cp_run({"parallel.cp=2", "parallel.cp_attention=ring"}));
  expect_equivalent(w1, base + "/cp2_ring", "cp 2, ring");
  // The recompute repeats the ring's communication inside backward.
  run_world(2, base + "/cp2_ring_ac",
            cp_run({"parallel.cp=2", "parallel.cp_attention=ring", "train.activation_checkpointing=full"}));
  expect_equivalent(w1, base + "/cp2_ring_ac", "cp 2, ring, activation checkpointing");
  EXPECT_NE(read_file(base + "/cp2_ring_ac/log.txt").find("activation checkpointing: 2 of 2 blocks recomputed"),
            std::string::npos);
  // 2 heads do not split over 4 ranks: auto picks ring.
  run_world(4, base + "/cp4_auto", cp_run({"parallel.cp=4"}));
  expect_equivalent(w1, base + "/cp4_auto", "cp 4, auto (ring)");
  EXPECT_NE(read_file(base + "/cp4_auto/log.txt").find("split over 4 ranks (49 per rank), ring attention"),
            std::string::npos);
  // FSDP over dp_shard 2 × cp 2: two sample slices, each split over two ranks.
  run_world(4, base + "/dp2_cp2", cp_run({"parallel.cp=2", "parallel.dp_shard=2"}));
  expect_equivalent(w1, base + "/dp2_cp2", "dp_shard 2 x cp 2, Ulysses");

  // The weights are sharded over dp_shard × cp: each of 4 ranks holds a quarter of the state
  // (the unsharded run also counts the fixed 196×64 pos_embed, a few % of the tiny model, so
  // the ratio sits a little under 1/4).
  const int64_t whole = peak_state_bytes(w1, 0);
  for (int r = 0; r < 4; ++r) {
    const double ratio = double(peak_state_bytes(base + "/dp2_cp2", r)) / double(whole);
    std::printf("[memory] dp_shard 2 x cp 2 rank %d: %.4f of world 1\n", r, ratio);
    EXPECT_GT(ratio, 0.22);
    EXPECT_LT(ratio, 0.251);
  }
}

TEST(DistContext, CheckpointOfAContextParallelRunResumesInOneProcess) {
  REQUIRE_DATA();
  const std::string base = scratch_dir("context_parallel_resume");
  const std::string w1 = base + "/world1", moved = base + "/moved";
  run_world(1, w1, cp_run({}));
  run_world(2, moved, cp_run({"parallel.cp=2", "train.steps=10"}));  // 2 shards (dp_shard 1 × cp 2) on disk
  run_world(1, moved, cp_run({}));                                   // consolidated, resumed unsplit
  expect_equivalent(w1, moved, "10 steps at cp 2, resumed for 10 in one process");
}
