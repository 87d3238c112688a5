// Flux with the built-in text path, distributed: FSDP over its double and single blocks (and the
// text encoder in the stem), and context parallelism of the joint [text, image] sequence — each
// stream split on the sequence dimension with its position ids — must give the losses, gradient
// norms and weights of the single-process run, with Ulysses and ring attention.
#include "cli_runner.h"
#include "equivalence.h"
#include "test_util.h"

#include <gtest/gtest.h>

using namespace flowtrain::test;

namespace {

// A compositions set for this binary (800 canvases), made once through the CLI.
const std::string& compositions() {
  static const std::string dir = [] {
    const std::string d = scratch_dir("dist_compositions") + "/set";
    auto r = run_flowtrain("data make-compositions --out " + d + " --num-train 800 --num-eval 8 --fashion-mnist " +
                           fashion_mnist_dir());
    if (r.exit_code != 0) ADD_FAILURE() << r.output;
    return d;
  }();
  return dir;
}

// The tiny config turned into a tiny text-to-image run: 196 image tokens (14×14 of 4×4 pixels) and
// 24 text tokens, both splitting evenly over 2 and 4 ranks; 2 heads (Ulysses at cp 2).
std::vector<std::string> flux_run(std::vector<std::string> extra) {
  std::vector<std::string> sets = {
      "model.arch=flux",         "model.size=flux-tiny",     "model.hidden=64",          "model.heads=2",
      "model.axes_dim=8,12,12",  "model.depth=1",            "model.depth_single=2",     "model.context_dim=32",
      "model.vec_dim=32",        "model.text_len=24",        "model.text_encoder_layers=1",
      "model.text_encoder_heads=2", "model.vocab_size=256",  "model.patch=4",            "model.image_size=56",
      "model.in_channels=3",     "data.source=compositions", "data.path=" + compositions(),
      "flow.resolution_shift=true"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return with(std::move(sets));
}

}  // namespace

TEST(DistFlux, TextToImageUnderFsdpAndJointSequenceContextParallelismMatchesOneProcess) {
  REQUIRE_DATA();
  const std::string base = scratch_dir("dist_flux");
  const std::string w1 = base + "/world1";
  run_world(1, w1, flux_run({}), {}, "flux");
  run_world(2, base + "/fsdp2", flux_run({}), {}, "flux");
  expect_equivalent(w1, base + "/fsdp2", "Flux + text encoder, FSDP over 2 ranks");
  run_world(2, base + "/cp2_ulysses", flux_run({"parallel.cp=2", "parallel.cp_attention=ulysses"}), {}, "flux");
  expect_equivalent(w1, base + "/cp2_ulysses", "Flux, cp 2 over [text, image], Ulysses");
  run_world(2, base + "/cp2_ring_ac",
            flux_run({"parallel.cp=2", "parallel.cp_attention=ring", "train.activation_checkpointing=full"}), {}, "flux");
  expect_equivalent(w1, base + "/cp2_ring_ac", "Flux, cp 2 over [text, image], ring, activation checkpointing");
  EXPECT_NE(read_file(base + "/cp2_ring_ac/log.txt").find("220 tokens per sample split over 2 ranks (110 per rank)"),
            std::string::npos);
  // 2 heads over 4 ranks: ring; 6 text and 49 image tokens per rank.
  run_world(4, base + "/cp4_ring", flux_run({"parallel.cp=4"}), {}, "flux");
  expect_equivalent(w1, base + "/cp4_ring", "Flux, cp 4 over [text, image], ring");
}
