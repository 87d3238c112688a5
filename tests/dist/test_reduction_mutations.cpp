// The equivalence checks must be able to see a wrong gradient reduction. Each reduction factor
// of the sharded step is broken on purpose (debug.inject.reduction, parallel/fsdp.h) and the
// run is compared with the single-process reference: expect_equivalent's checks must fail, and
// the gradient norm must show the exact factor at step 1 (same weights, same batch).
//
// The runs use optim.grad_clip=0, where a constant gradient scale c should be hardest to see:
// AdamW divides m by √v + ε. Observed on the 2-core CI machine (2026-12-03, printed as [mutation]):
//   data-parallel mean → sum (world 2, ×2):  grad-norm ratio 2.000000 at step 1; over 20 steps
//                                            loss rel diff 6.0e-4, weights 2.3e-2
//   HSDP replica average → sum (2 × 2, ×2):  ratio 2.000000; loss 6.0e-4, weights 2.3e-2
//   × cp skipped (cp 2, Ulysses, ÷2):        ratio 0.500000; loss 7.9e-4, weights 3.6e-2
// Losses and weights fail their bounds too here: the adaLN-Zero initialisation leaves many
// gradients near zero, where ε, not √v, sets the update, so the scale does leak into the
// weights. With the tiny config's clip at 1.0 the same mutations moved losses by 1.7e-2 (×2) and
// 4.9e-2 (÷2), weights by 1.1e-2 and 1.8e-2. The norm is the check that names the factor.
#include "equivalence.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <cstdio>

using namespace flowtrain::test;

namespace {

// Runs `world` ranks with the reduction broken as `fault` and checks that the comparison with
// `reference` fails through the gradient norm.
void expect_caught(const std::string& reference, int world, const std::string& run,
                   const std::vector<std::string>& sets, const std::string& fault, double factor) {
  std::vector<std::string> faulty = sets;
  faulty.push_back("debug.allow_inject=true");
  faulty.push_back("debug.inject.reduction=" + fault);
  run_world(world, run, faulty);
  const Difference d = compare_runs(reference, run);
  const bool losses_and_weights_pass =
      d.loss_rel <= kLossRelTol && d.weight_abs <= kWeightAbsTol && d.ema_abs <= kWeightAbsTol;
  std::printf("[mutation] %s (gradients x%.2f): grad-norm ratio at step 1 %.6f, max grad-norm rel diff %.3g | loss "
              "rel diff %.3g, weight abs diff %.3g, EMA abs diff %.3g -> losses and weights alone %s\n",
              fault.c_str(), factor, d.first_grad_norm_ratio, d.grad_norm_rel, d.loss_rel, d.weight_abs, d.ema_abs,
              losses_and_weights_pass ? "PASS (would miss it)" : "fail too");
  EXPECT_GT(d.grad_norm_rel, kGradNormRelTol) << fault << ": the equivalence check would not see it";
  // Step 1 starts from identical weights on an identical batch: the norm is off by the factor,
  // up to fp32 summation order (the kGradNormRelTol of honest runs).
  EXPECT_NEAR(d.first_grad_norm_ratio, factor, factor * kGradNormRelTol) << fault;
}

}  // namespace

TEST(DistMutations, EveryWrongReductionFactorFailsTheEquivalenceCheck) {
  REQUIRE_DATA();
  const std::string base = scratch_dir("mutations");
  const std::vector<std::string> no_clip = with({"optim.grad_clip=0"});
  const std::string w1 = base + "/world1";
  run_world(1, w1, no_clip);
  expect_caught(w1, 2, base + "/sum_over_shard_group", no_clip, "sum_over_shard_group", 2.0);
  std::vector<std::string> hsdp = no_clip;
  hsdp.push_back("parallel.dp_replicate=2");
  expect_caught(w1, 4, base + "/sum_over_replicas", hsdp, "sum_over_replicas", 2.0);

  // Context parallelism needs a token count that splits: the tiny config at patch 2 (196 tokens).
  std::vector<std::string> patch2 = no_clip;
  patch2.push_back("model.patch=2");
  const std::string w1_patch2 = base + "/world1_patch2";
  run_world(1, w1_patch2, patch2);
  std::vector<std::string> cp2 = patch2;
  cp2.push_back("parallel.cp=2");
  expect_caught(w1_patch2, 2, base + "/no_context_sum", cp2, "no_context_sum", 0.5);
}
