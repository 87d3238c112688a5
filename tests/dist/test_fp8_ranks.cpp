// fp8 across ranks: delayed scaling's amaxes are reduced to one scale for every rank, and a
// recipe whose casts do not depend on how the batch is split trains under FSDP, and under
// context parallelism with activation checkpointing, as in one process; FSDP's fp8 all-gather
// computes what gathering in fp32 and then casting does.
#include "cli_runner.h"
#include "equivalence.h"
#include "rank_runner.h"
#include "test_util.h"

#include "models/fp8/convert.h"
#include "parallel/runtime.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/fp8_setup.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <stdexcept>

using namespace flowtrain;
using namespace flowtrain::test;

TEST(DistFp8, DelayedScalingCommitsTheLargestAmaxOfAnyRankOnEveryRank) {
  // Each rank sees its own activations (rank r: values up to 3·(r + 1)); after the commit both
  // hold the same history, the max over ranks, so both derive the same scales next step.
  const auto errors = run_thread_ranks(2, parallel::MeshShape{1, 2, 1, 1}, [](int rank, parallel::Runtime& runtime) {
    auto layer = std::make_shared<models::fp8::Fp8Linear>(models::fp8::Recipe::delayed, /*emulate=*/true);
    const at::Tensor x = (at::arange(24, at::kFloat).view({4, 6}) / 23.0 * 3.0 * (rank + 1)).requires_grad_(true);
    const at::Tensor w = at::full({2, 6}, 0.5f * (2 - rank)).requires_grad_(true);  // rank 0 has the larger weight
    layer->linear(x, w, at::Tensor()).sum().backward();
    models::fp8::Fp8Conversion conversion;
    conversion.layers.push_back(layer);
    trainer::commit_fp8_amax(conversion, &runtime.world_group());
    const at::Tensor want = at::tensor({6.0f, 1.0f, 1.0f});  // max|x| of rank 1, max|W| of rank 0, ∂y = 1
    if (!at::allclose(layer->amax_history()[0], want))
      throw std::runtime_error("rank " + std::to_string(rank) + " history" +
                               " differs from the max over ranks");
  });
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(DistFp8, RowwiseWithBf16WeightGradShardedMatchesOneProcess) {
  REQUIRE_DATA();
  // rowwise_gw_hp's casts are per token (x, ∂y), per weight row or column, or elementwise (the
  // bf16 weight gradient): none depends on which tokens share a rank, so the sharded run
  // computes the same function. Not bit for bit, and not within the fp32 FSDP tolerances
  // (equivalence.h): an fp32 reordering moves a value by an ulp, and the few values that sit on
  // an e4m3 rounding boundary (3 mantissa bits) then round to the neighbouring code, a 6-12 %
  // jump in that element. Measured on these 20 steps: loss 3.3e-5, gradient norm 5.8e-4
  // relative, weights 1.1e-3 absolute (AdamW turns any gradient difference into ~lr-sized
  // steps). The bounds below are 2.5-6x those; a real sharding bug (tests/dist/
  // test_reduction_mutations.cpp: a missing shard, a wrong average) moves the gradient norm by a
  // factor from step 1 and the loss by > 1e-3, far outside them.
  const std::string base = scratch_dir("fp8_equivalence");
  const auto sets = with({"fp8.recipe=rowwise_gw_hp"});
  run_world(1, base + "/world1", sets);
  run_world(2, base + "/world2", sets);
  const Difference d = compare_runs(base + "/world1", base + "/world2");
  std::printf("[equivalence] fp8 rowwise_gw_hp, world 2: loss %.3g, grad norm %.3g, step-1 grad-norm ratio %.8f, "
              "weights %.3g\n", d.loss_rel, d.grad_norm_rel, d.first_grad_norm_ratio, d.weight_abs);
  EXPECT_LE(d.loss_rel, 2e-4);
  EXPECT_LE(d.grad_norm_rel, 1.5e-3);
  // Step 1 (same weights, same batch) shows no flip at all: measured ratio 1 to 8 digits; the
  // fp32 bound (kGradNormRelTol) holds there.
  EXPECT_NEAR(d.first_grad_norm_ratio, 1.0, kGradNormRelTol);
  EXPECT_LE(d.weight_abs, 5e-3);
  EXPECT_NE(read_file(base + "/world2/log.txt").find("fp8 rowwise_gw_hp (emulated): 8 linears converted"),
            std::string::npos);
}

TEST(DistFp8, RowwiseWithBf16WeightGradUnderContextParallelismMatchesOneProcess) {
  REQUIRE_DATA();
  // The same argument as under FSDP: rowwise_gw_hp's casts are per token, per weight row or
  // column, or elementwise, so splitting each sample's tokens over cp ranks (ring attention,
  // activation checkpointing recomputing the fp8 forward) computes the same function; only fp32
  // reorderings differ, and the rare e4m3 rounding-boundary flips they cause.
  const std::string base = scratch_dir("fp8_context");
  const auto sets = with({"model.patch=2", "fp8.recipe=rowwise_gw_hp"});
  auto cp = sets;
  for (const char* s : {"parallel.cp=2", "parallel.cp_attention=ring", "train.activation_checkpointing=full"})
    cp.push_back(s);
  run_world(1, base + "/world1", sets);
  run_world(2, base + "/cp2", cp);
  const Difference d = compare_runs(base + "/world1", base + "/cp2");
  std::printf("[equivalence] fp8 rowwise_gw_hp, cp 2 ring + activation checkpointing: loss %.3g, grad norm %.3g, "
              "step-1 grad-norm ratio %.8f, weights %.3g\n",
              d.loss_rel, d.grad_norm_rel, d.first_grad_norm_ratio, d.weight_abs);
  // Measured on these 20 steps: loss 2.3e-5, gradient norm 3.4e-4 relative, step-1 gradient
  // norm ratio 1 + 8e-8, weights 1.7e-3 absolute. The FSDP test's bounds (above) hold with
  // ≥ 3x margin; a lost ring block or a wrong cp factor moves the step-1 norm by a factor.
  EXPECT_LE(d.loss_rel, 2e-4);
  EXPECT_LE(d.grad_norm_rel, 1.5e-3);
  EXPECT_NEAR(d.first_grad_norm_ratio, 1.0, kGradNormRelTol);
  EXPECT_LE(d.weight_abs, 5e-3);
}

TEST(DistFp8, TensorwiseWeightsAllGatheredInFp8ComputeWhatGatheringThenCastingDoes) {
  REQUIRE_DATA();
  // With fp8.all_gather each rank casts its fp32 master slice of a weight with the whole
  // weight's scale (its amax all-reduced over the shards) and the ranks gather the e4m3 bytes;
  // without it they gather fp32 and the linear casts the whole weight. A max is exact, so the
  // scale is the same, and the cast is the same saturating round-to-nearest-even element by
  // element: the same bytes, so step 1's forward is bit-identical (a weak check alone: the
  // zero-initialised adaLN gates hide the blocks at step 1). The fp8 weights form a
  // unit of their own ("blocks.N.fp8"), so a rank's shard covers other elements than before:
  // the gradient norm (a sum of per-shard sums) and with it the clip differ by ulps from step 1
  // on, and could move later steps by the e4m3 rounding-boundary flips such ulps cause — the
  // same kind of difference as rowwise_gw_hp's sharded run above, and bounded the same way.
  // Measured on these 20 steps: every loss and the final weights bit-identical, the gradient
  // norm within 7.4e-8 relative. Without the amax all-reduce (each rank scaling by its own
  // slice) the losses differ by 4 % and the weights by 0.05: far outside.
  // The gathered run also recomputes every block in backward (activation checkpointing: the
  // recompute must get the forward's bytes and scales) and both draw a sample grid from the EMA
  // weights at step 10 (swapped shards: the scales must follow them, and training after it
  // must get the raw weights' scales back).
  const std::string base = scratch_dir("fp8_all_gather");
  const auto sets = with({"fp8.recipe=tensorwise", "sample.every=10", "sample.num=8", "sample.steps=4"});
  auto gathered = sets;
  gathered.push_back("fp8.all_gather=true");
  gathered.push_back("train.activation_checkpointing=full");
  run_world(2, base + "/cast_after_gather", sets);
  run_world(2, base + "/gather_fp8", gathered);
  const auto a = read_metrics(base + "/cast_after_gather"), b = read_metrics(base + "/gather_fp8");
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(a[0]["loss"].get<double>(), b[0]["loss"].get<double>());  // step 1: the same bytes, bit for bit
  EXPECT_TRUE(read_file(base + "/cast_after_gather/samples/step-0000010.png") ==
              read_file(base + "/gather_fp8/samples/step-0000010.png"))
      << "the sample grids from the EMA weights differ";
  const Difference d = compare_runs(base + "/cast_after_gather", base + "/gather_fp8");
  std::printf("[equivalence] fp8 tensorwise, world 2, fp8 all-gather vs gather then cast: loss %.3g, grad norm %.3g, "
              "step-1 grad-norm ratio %.10f, weights %.3g\n",
              d.loss_rel, d.grad_norm_rel, d.first_grad_norm_ratio, d.weight_abs);
  EXPECT_NEAR(d.first_grad_norm_ratio, 1.0, kGradNormRelTol);
  EXPECT_LE(d.loss_rel, 2e-4);
  EXPECT_LE(d.grad_norm_rel, 1.5e-3);
  EXPECT_LE(d.weight_abs, 5e-3);

  // The converted weights really travelled as their own fp8 units: each block's qkv, proj, fc1
  // and fc2 weights (the tiny config's 8 converted linears over 2 blocks), nothing else; the
  // checkpoint of that layout consolidates like any other (compare_runs read it above).
  const auto layout = trainer::load_checkpoint_layout(final_checkpoint(base + "/gather_fp8"));
  ASSERT_TRUE(layout.has_value());
  int64_t fp8_units = 0, fp8_weights = 0;
  for (const auto& unit : layout->units) {
    if (unit.name.size() < 4 || unit.name.compare(unit.name.size() - 4, 4, ".fp8") != 0) continue;
    ++fp8_units;
    for (const auto& p : unit.params) {
      ++fp8_weights;
      EXPECT_EQ(p.name.compare(p.name.size() - 7, 7, ".weight"), 0) << p.name;
    }
  }
  EXPECT_EQ(fp8_units, 2);
  EXPECT_EQ(fp8_weights, 8);
  EXPECT_NE(read_file(base + "/gather_fp8/log.txt").find("fp8 all-gather: the 8 converted weights"), std::string::npos);
}

TEST(DistFp8, AllGatherInFp8IsRefusedForAnotherRecipeOrAnUnshardedRun) {
  REQUIRE_DATA();
  const std::string base = scratch_dir("fp8_all_gather_refused");
  auto r = train_tiny(base + "/rowwise", with({"fp8.recipe=rowwise", "fp8.all_gather=true"}));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("'fp8.all_gather' needs 'fp8.recipe' tensorwise"), std::string::npos) << r.output;
  r = train_tiny(base + "/one_process", with({"fp8.recipe=tensorwise", "fp8.all_gather=true"}));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("this run is not sharded"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(base + "/one_process"));  // refused before anything is written
}

TEST(DistFp8, ResumingWithOtherFp8WeightsReshardsByParameterNotByUnitSize) {
  REQUIRE_DATA();
  // Which weights go to a '<unit>.fp8' sibling depends on fp8.include/exclude. Excluding fc1
  // ([256, 64]) and then fc2 ([64, 256]) leaves every unit the same size with other parameters
  // at other offsets: the resume must see that the layout differs and re-shard by parameter
  // name, not read its flat shards as written (which would put fc1's weights, moments and EMA
  // where fc2's are).
  const std::string run = scratch_dir("fp8_other_units") + "/run";
  run_world(2, run, with({"fp8.recipe=tensorwise", "fp8.all_gather=true", "fp8.exclude=blocks.*.mlp.fc1", "train.steps=10"}));
  run_world(2, run, with({"fp8.recipe=tensorwise", "fp8.all_gather=true", "fp8.exclude=blocks.*.mlp.fc2"}));
  const std::string log = read_file(run + "/log.txt");
  EXPECT_NE(log.find("re-sharding it for 2"), std::string::npos) << log;
  const auto rows = read_metrics(run);
  ASSERT_EQ(rows.size(), 20u);
  // Continuity: the resumed run starts from the trained weights (a shuffled layout would throw
  // the loss back towards its initial value).
  EXPECT_LT(rows[10]["loss"].get<double>(), 1.25 * rows[9]["loss"].get<double>());
}
