// The autoencoder family (model.arch vae) under FSDP: its objective draws each sample's ε from a
// seed of (run seed, step, the sample's row in the global batch), so 2 ranks — each with half the
// batch, encoder and decoder sharded as two units — must give the losses, gradient norms and
// weights of the single-process run. A draw per micro-batch instead of per row fails this at
// step 1 (each rank would draw the first rows' ε for its own slice).
#include "equivalence.h"
#include "test_util.h"

#include <gtest/gtest.h>

using namespace flowtrain::test;

namespace {

// FLUX's autoencoder at a few thousand parameters on 28² Fashion-MNIST: widths 16, 32 (2× down to
// 14² × 4 latents), one ResNet block a level, GroupNorm(8). A large KL weight so the sampled term
// (where ε enters) is a visible part of the loss.
std::vector<std::string> vae_run() {
  return with({"model.arch=vae", "model.size=ae-tiny", "model.hidden=16", "model.depth=1", "model.ch_mult=1,2",
               "model.norm_groups=8", "model.z_channels=4", "model.kl_weight=0.05", "model.image_size=28",
               "model.in_channels=1"});
}

}  // namespace

TEST(DistVae, TheAutoencoderUnderFsdpMatchesOneProcess) {
  REQUIRE_DATA();
  const std::string base = scratch_dir("dist_vae");
  run_world(1, base + "/world1", vae_run(), {}, "vae");
  run_world(2, base + "/fsdp2", vae_run(), {}, "vae");
  expect_equivalent(base + "/world1", base + "/fsdp2", "VAE, FSDP over 2 ranks");
}
