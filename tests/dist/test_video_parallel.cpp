// The video model (Flux MMDiT over 3-D ids) under context parallelism: the joint [text, video]
// sequence of every clip split over cp ranks — each stream with its (t, row, col) ids — must give
// the single-process run's losses, gradient norms and weights over 20 steps, with Ulysses, ring
// and the hybrid of the two (Ulysses inside pairs of ranks, ring across the pairs), also with the
// attention sublayers recomputed in backward; and a
// checkpoint written at cp 2 must resume in one process.
#include "cli_runner.h"
#include "equivalence.h"
#include "test_util.h"

#include <gtest/gtest.h>

using namespace flowtrain::test;

namespace {

// A moving-fashion set for this binary: 48 clips of 4 frames in 2 shards.
const std::string& clips() {
  static const std::string dir = [] {
    const std::string d = scratch_dir("dist_video_data") + "/mf";
    auto r = run_flowtrain("data make-moving-fashion --fashion-mnist " + fashion_mnist_dir() + " --out " + d +
                           " --num 48 --frames 4 --max-count 24 --num-eval 4");
    if (r.exit_code != 0) ADD_FAILURE() << r.output;
    return d;
  }();
  return dir;
}

// The tiny config turned into a tiny video run: 4 frames of 8×8 patches (256 video tokens) and
// 12 text tokens, both splitting evenly over 2 and 4 ranks; 2 heads (Ulysses at cp 2, and as
// the inner degree of the hybrid at cp 4).
std::vector<std::string> video_run(std::vector<std::string> extra) {
  std::vector<std::string> sets = {
      "model.arch=flux",         "model.size=flux-tiny",      "model.hidden=64",         "model.heads=2",
      "model.axes_dim=8,12,12",  "model.depth=1",             "model.depth_single=1",    "model.context_dim=32",
      "model.vec_dim=32",        "model.text_len=12",         "model.text_encoder_layers=1",
      "model.text_encoder_heads=2", "model.vocab_size=128",   "model.patch=4",           "model.image_size=32",
      "model.in_channels=3",     "model.frames=4",            "data.source=shards",      "data.path=" + clips(),
      "data.shards=" + clips() + "/train-{000000..000001}.tar", "data.video.frames=4",   "data.batch_size=8",
      "flow.resolution_shift=true"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return with(std::move(sets));
}

}  // namespace

TEST(DistVideo, ContextParallelVideoRunsMatchTheSingleProcessRunFor20Steps) {
  REQUIRE_DATA();
  const std::string base = scratch_dir("dist_video");
  const std::string w1 = base + "/world1";
  run_world(1, w1, video_run({}), {}, "flux");
  run_world(2, base + "/cp2_ulysses", video_run({"parallel.cp=2", "parallel.cp_attention=ulysses"}), {}, "flux");
  expect_equivalent(w1, base + "/cp2_ulysses", "video, cp 2, Ulysses");
  run_world(2, base + "/cp2_ring", video_run({"parallel.cp=2", "parallel.cp_attention=ring"}), {}, "flux");
  expect_equivalent(w1, base + "/cp2_ring", "video, cp 2, ring");
  run_world(4, base + "/cp4_ring", video_run({"parallel.cp=4", "parallel.cp_attention=ring"}), {}, "flux");
  expect_equivalent(w1, base + "/cp4_ring", "video, cp 4, ring");
  run_world(4, base + "/cp4_hybrid",
            video_run({"parallel.cp=4", "parallel.cp_attention=hybrid", "parallel.cp_ulysses=2"}), {}, "flux");
  expect_equivalent(w1, base + "/cp4_hybrid", "video, cp 4 = Ulysses 2 x ring 2");
  const std::string log = read_file(base + "/cp4_hybrid/log.txt");
  EXPECT_NE(log.find("268 tokens per sample split over 4 ranks (67 per rank), hybrid attention (Ulysses over 2 "
                     "adjacent ranks, ring across 2 groups)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("cp 4 (ulysses 2 × ring 2)"), std::string::npos) << log;
  // Selective checkpointing: the recomputed attention repeats the ring's hops inside backward.
  run_world(2, base + "/cp2_ring_attention_ac",
            video_run({"parallel.cp=2", "parallel.cp_attention=ring", "train.activation_checkpointing=attention"}), {}, "flux");
  expect_equivalent(w1, base + "/cp2_ring_attention_ac", "video, cp 2, ring, attention recomputed");
  EXPECT_NE(read_file(base + "/cp2_ring_attention_ac/log.txt")
                .find("activation checkpointing: the attention sublayer of 2 of 2 blocks recomputed"),
            std::string::npos);
}

TEST(DistVideo, CheckpointOfAContextParallelVideoRunResumesInOneProcess) {
  REQUIRE_DATA();
  const std::string base = scratch_dir("dist_video_resume");
  const std::string w1 = base + "/world1", moved = base + "/moved";
  run_world(1, w1, video_run({}), {}, "flux");
  run_world(2, moved, video_run({"parallel.cp=2", "train.steps=10"}), {}, "flux");  // 2 shards (dp_shard 1 × cp 2) on disk
  run_world(1, moved, video_run({}), {}, "flux");                                   // consolidated, resumed unsplit
  expect_equivalent(w1, moved, "video: 10 steps at cp 2, resumed for 10 in one process");
}
