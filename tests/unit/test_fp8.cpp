// FP8 compute paths (models/fp8/): casts, the emulated GEMM, the fp8 linear of every recipe
// against fp32, delayed scaling's history, which linears convert, and the activation-checkpoint
// recompute. Thresholds are torchao's (docs/design/fp8.md, "How to validate"): they are what
// a correct fp8 linear reaches on random data with outliers; a wrong scale convention, a missing
// saturation or a transposed operand lands far below them (single-digit or negative dB).
#include "models/fp8/convert.h"
#include "models/fp8/fp8_linear.h"
#include "models/fp8/quantize.h"
#include "models/fp8/scaled_gemm.h"
#include "models/autocast_region.h"
#include "models/dit/dit.h"
#include "parallel/activation_checkpoint.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

using namespace flowtrain::models;
using namespace flowtrain::models::fp8;
namespace parallel = flowtrain::parallel;

namespace {
// Gaussian data with a few large outliers (the activations of real transformers have them;
// they are what makes a per-tensor scale lose resolution for everything else).
at::Tensor with_outliers(std::vector<int64_t> shape, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor x = at::randn(shape);
  at::Tensor mask = at::rand(shape) < 0.001;
  return at::where(mask, x * 30, x);
}

const Recipe kRecipes[] = {Recipe::tensorwise, Recipe::rowwise, Recipe::rowwise_gw_hp,
                           Recipe::delayed,    Recipe::mxfp8,   Recipe::mxfp8_rceil};

struct LinearResult {
  at::Tensor y, grad_x, grad_w, grad_b;
};
LinearResult run_linear(LinearCompute* compute, const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& b0,
                        const at::Tensor& dy) {
  at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
  at::Tensor y = compute ? compute->linear(x, w, b) : at::linear(x.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble));
  y.backward(compute ? dy : dy.to(at::kDouble));
  return {y.detach(), x.grad(), w.grad(), b.grad()};
}
}  // namespace

TEST(Fp8, CastRoundTripsKeepTwentyFiveDecibels) {
  const at::Tensor x = with_outliers({64, 256}, 1);
  EXPECT_GE(sqnr_db(x, quantize_tensor(x, Format::e4m3, tensor_scale(abs_max(x), Format::e4m3)).dequantize()), 25);
  EXPECT_GE(sqnr_db(x, quantize_rows(x, Format::e4m3).dequantize()), 25);
  EXPECT_GE(sqnr_db(x, quantize_blocks(x).dequantize()), 25);
  // e5m2 has one mantissa bit less: ~6 dB lower, still above 20 on this data.
  EXPECT_GE(sqnr_db(x, quantize_tensor(x, Format::e5m2, tensor_scale(abs_max(x), Format::e5m2)).dequantize()), 20);
}

TEST(Fp8, CastsSaturateInsteadOfOverflowingAndZeroTensorsStayZero) {
  const at::Tensor x = at::tensor({1.0f, -2.0f, 1000.0f, -1e6f}).view({1, 4});
  const Quantized q = quantize_tensor(x, Format::e4m3, at::tensor(1.0f));  // a stale scale: 1000 and 1e6 overflow
  const at::Tensor back = q.dequantize();
  EXPECT_FALSE(at::isnan(back).any().item<bool>());
  EXPECT_EQ(back[0][2].item<float>(), 448.0f);
  EXPECT_EQ(back[0][3].item<float>(), -448.0f);
  EXPECT_DOUBLE_EQ(cast_stats(x, q).saturated, 0.5);
  const Quantized q5 = quantize_tensor(at::full({1, 2}, 1e6f), Format::e5m2, at::tensor(1.0f));
  EXPECT_EQ(q5.dequantize()[0][0].item<float>(), 57344.0f);

  const at::Tensor zeros = at::zeros({4, 64});
  for (const Quantized& z : {quantize_tensor(zeros, Format::e4m3, tensor_scale(abs_max(zeros), Format::e4m3)),
                             quantize_rows(zeros, Format::e4m3), quantize_blocks(zeros)}) {
    EXPECT_TRUE(at::isfinite(z.inv_scale).all().item<bool>()) << name(z.scaling);
    EXPECT_EQ(z.dequantize().abs().max().item<float>(), 0.0f) << name(z.scaling);
  }
}

TEST(Fp8, RowAndBlockScalesArePowersOfTwoAndTheLargestElementFits) {
  const at::Tensor x = with_outliers({16, 64}, 2);
  for (const Quantized& q : {quantize_rows(x, Format::e4m3), quantize_blocks(x)}) {
    const at::Tensor log2 = at::log2(q.inv_scale);
    EXPECT_TRUE(at::equal(log2, at::round(log2))) << name(q.scaling);
  }
  // Rows: 2^floor(log2(448 / amax)) never pushes an element past 448.
  EXPECT_EQ(cast_stats(x, quantize_rows(x, Format::e4m3)).saturated, 0.0);
  // MX block [1, 2, …] with amax 6: exponent floor(log2 6) − 8 = −6, so 6 · 2^6 = 384 ≤ 448.
  const at::Tensor block = at::linspace(0.2, 6.0, 32).view({1, 32});
  EXPECT_FLOAT_EQ(quantize_blocks(block).inv_scale.item<float>(), std::ldexp(1.0f, -6));
}

TEST(Fp8, UnderflowIsCountedForValuesBelowTheSmallestSubnormal) {
  // Per-tensor scale from amax 448 (scale 1): e4m3's smallest subnormal is 2^-9, so 1e-4 flushes to 0.
  const at::Tensor x = at::tensor({448.0f, 1e-4f, 1e-4f, 1.0f}).view({1, 4});
  const Quantized q = quantize_tensor(x, Format::e4m3, tensor_scale(abs_max(x), Format::e4m3));
  EXPECT_DOUBLE_EQ(cast_stats(x, q).underflow, 0.5);
}

TEST(Fp8, EmulatedGemmEqualsAtenScaledMmOnTheCpu) {
  // ATen's own fp8 GEMM (its CPU kernel, tensorwise) against our emulation of the same operands:
  // an independent check of the inverse-scale convention. Both accumulate in fp32: only
  // summation order differs (≥ 60 dB); against the exact product both clear the 25 dB bar.
  const at::Tensor a = with_outliers({32, 64}, 3), b = with_outliers({48, 64}, 4);
  const OperandCast e4m3{true, Format::e4m3, Scaling::tensor};
  const at::Tensor emulated = scaled_gemm({a, e4m3, {}}, {b, e4m3, {}}, false, /*emulate=*/true, at::kFloat);
  const Quantized qa = quantize(a, e4m3), qb = quantize(b, e4m3);
  at::Tensor aten;
  try {
    aten = at::_scaled_mm(qa.data, qb.data.t(), qa.inv_scale, qb.inv_scale, std::nullopt, std::nullopt, at::kFloat);
  } catch (const std::exception& e) {
    GTEST_SKIP() << "this LibTorch has no CPU _scaled_mm: " << e.what();
  }
  EXPECT_GE(sqnr_db(aten, emulated), 60);
  const at::Tensor exact = at::matmul(a.to(at::kDouble), b.to(at::kDouble).t());
  EXPECT_GE(sqnr_db(exact, emulated), 25);
  EXPECT_GE(sqnr_db(exact, aten), 25);
}

TEST(Fp8, EveryRecipesLinearMeetsTorchaosThresholdsAgainstFloat64) {
  const at::Tensor x = with_outliers({4, 33, 96}, 5), w = with_outliers({64, 96}, 6) * 0.1, b = at::randn({64});
  const at::Tensor dy = with_outliers({4, 33, 64}, 7);
  const LinearResult ref = run_linear(nullptr, x, w, b, dy);
  for (Recipe r : kRecipes) {
    Fp8Linear compute(r, /*emulate=*/true);
    const LinearResult got = run_linear(&compute, x, w, b, dy);
    SCOPED_TRACE(name(r));
    EXPECT_EQ(got.y.scalar_type(), at::kFloat);
    EXPECT_GE(sqnr_db(ref.y, got.y), block_scaled(r) ? 26 : 18);
    EXPECT_GE(sqnr_db(ref.grad_x, got.grad_x), 18);
    EXPECT_GE(sqnr_db(ref.grad_w, got.grad_w), 17);
    EXPECT_GE(sqnr_db(ref.grad_b, got.grad_b), 60);  // the bias gradient is a plain fp32 sum
  }
}

TEST(Fp8, RowwiseWithHighPrecisionWeightGradIsCloserThanRowwise) {
  // The point of rowwise_gw_hp: its ∂W (bf16, 8 mantissa bits) beats rowwise's (e4m3, 3 bits).
  const at::Tensor x = with_outliers({128, 64}, 8), w = with_outliers({64, 64}, 9) * 0.1, b = at::zeros({64});
  const at::Tensor dy = with_outliers({128, 64}, 10);
  const LinearResult ref = run_linear(nullptr, x, w, b, dy);
  Fp8Linear rowwise(Recipe::rowwise, true), hp(Recipe::rowwise_gw_hp, true);
  const double sqnr_rowwise = sqnr_db(ref.grad_w, run_linear(&rowwise, x, w, b, dy).grad_w);
  const double sqnr_hp = sqnr_db(ref.grad_w, run_linear(&hp, x, w, b, dy).grad_w);
  EXPECT_GT(sqnr_hp, sqnr_rowwise + 10) << sqnr_hp << " vs " << sqnr_rowwise;
}

TEST(Fp8, ZeroInputGivesTheBiasAndFiniteGradients) {
  const at::Tensor x = at::zeros({8, 32}), w = at::randn({16, 32}), b = at::randn({16}), dy = at::randn({8, 16});
  for (Recipe r : kRecipes) {
    Fp8Linear compute(r, true);
    const LinearResult got = run_linear(&compute, x, w, b, dy);
    SCOPED_TRACE(name(r));
    EXPECT_TRUE(at::allclose(got.y, b.expand({8, 16})));
    EXPECT_TRUE(at::isfinite(got.grad_x).all().item<bool>());
    EXPECT_EQ(got.grad_w.abs().max().item<float>(), 0.0f);  // ∂W = ∂yᵀ·x = 0
  }
}

TEST(Fp8, UnderBf16AutocastTheOutputIsBf16LikeAtLinear) {
  const at::Tensor x = at::randn({4, 32}), w = at::randn({16, 32}), b = at::randn({16});
  Fp8Linear compute(Recipe::tensorwise, true);
  AutocastRegion autocast(true, c10::kCPU);
  EXPECT_EQ(compute.linear(x, w, b).scalar_type(), at::linear(x, w, b).scalar_type());
  EXPECT_EQ(compute.linear(x, w, b).scalar_type(), at::kBFloat16);
}

TEST(Fp8, DelayedScalingStartsDynamicThenUsesTheCommittedHistory) {
  const at::Tensor x = with_outliers({16, 32}, 11), w = at::randn({16, 32}), b = at::zeros({16}), dy = at::randn({16, 16});
  Fp8Linear delayed(Recipe::delayed, true, {/*history_len=*/2, AmaxReduce::max});
  Fp8Linear tensorwise(Recipe::tensorwise, true);
  // Step 1: no history yet, so the scales are the current amaxes: exactly tensorwise.
  const LinearResult first = run_linear(&delayed, x, w, b, dy);
  const LinearResult dynamic = run_linear(&tensorwise, x, w, b, dy);
  EXPECT_TRUE(at::equal(first.y, dynamic.y));
  EXPECT_TRUE(at::equal(first.grad_w, dynamic.grad_w));
  // The amaxes of (x, W, ∂y) were recorded; a commit moves them into the history.
  const at::Tensor want = at::stack({x.abs().max(), w.abs().max(), dy.abs().max()});
  EXPECT_TRUE(at::equal(delayed.pending_amax(), want));
  Fp8Conversion conversion;
  conversion.layers.push_back(std::shared_ptr<Fp8Linear>(&delayed, [](Fp8Linear*) {}));
  int64_t reductions = 0;
  commit_amax_histories(conversion, [&](at::Tensor& all) {
    ++reductions;
    EXPECT_EQ(all.sizes(), (std::vector<int64_t>{1, 3}));
    all.mul_(3);  // as if another rank had seen 3x larger values: every rank then uses the max
  });
  EXPECT_EQ(reductions, 1);
  EXPECT_TRUE(at::equal(delayed.amax_history()[0], want * 3));
  EXPECT_EQ(delayed.pending_amax().abs().max().item<float>(), 0.0f);
  // Step 2: the input's scale now comes from amax 3·max|x|, so x uses a third of e4m3's range:
  // a different (coarser) result than the dynamic scale gives, and nothing saturates. (A factor
  // that is a power of two would give the same fp8 values: scaling by 2^k only moves exponents.)
  const LinearResult second = run_linear(&delayed, x, w, b, dy);
  EXPECT_FALSE(at::equal(second.y, dynamic.y));
  EXPECT_GE(sqnr_db(run_linear(nullptr, x, w, b, dy).y, second.y), 18);
}

TEST(Fp8, DelayedScalingSaturatesWhenTheHistoryUnderestimates) {
  Fp8Linear delayed(Recipe::delayed, true, {1, AmaxReduce::most_recent});
  const at::Tensor w = at::randn({8, 32}), b = at::zeros({8});
  run_linear(&delayed, at::randn({4, 32}) * 0.01, w, b, at::randn({4, 8}));  // a quiet step
  Fp8Conversion conversion;
  conversion.layers.push_back(std::shared_ptr<Fp8Linear>(&delayed, [](Fp8Linear*) {}));
  commit_amax_histories(conversion, {});
  // The next input is 1000x larger than the history says: it saturates at ±448/scale, finitely.
  const LinearResult loud = run_linear(&delayed, at::randn({4, 32}) * 10, w, b, at::randn({4, 8}));
  EXPECT_TRUE(at::isfinite(loud.y).all().item<bool>());
  EXPECT_TRUE(at::isfinite(loud.grad_w).all().item<bool>());
}

TEST(Fp8, DelayedScalingFallsBackToTheOperandsAmaxWhereTheHistorySawZerosAndNoGradPassesRecordNothing) {
  // Step 1 of a zero-initialised block: ∂y ≡ 0, so the committed ∂y amax is 0. Step 2's ∂y must
  // then be scaled by its own amax (exactly tensorwise's), not by 57344/1e-12, which would clip
  // every element to ±57344 and turn ∂W into sign noise.
  const at::Tensor x = with_outliers({16, 32}, 5), w = at::randn({8, 32}), b = at::zeros({8}), dy = at::randn({16, 8});
  Fp8Linear delayed(Recipe::delayed, true, {/*history_len=*/4, AmaxReduce::max});
  Fp8Conversion conversion;
  conversion.layers.push_back(std::shared_ptr<Fp8Linear>(&delayed, [](Fp8Linear*) {}));
  run_linear(&delayed, x, w, b, at::zeros({16, 8}));
  commit_amax_histories(conversion, {});
  EXPECT_EQ(delayed.amax_history()[0][2].item<float>(), 0.0f);
  Fp8Linear tensorwise(Recipe::tensorwise, true);
  const LinearResult step2 = run_linear(&delayed, x, w, b, dy), dynamic = run_linear(&tensorwise, x, w, b, dy);
  EXPECT_TRUE(at::equal(step2.grad_w, dynamic.grad_w));  // x and W: history amax = their own here
  EXPECT_TRUE(at::equal(step2.grad_x, dynamic.grad_x));
  EXPECT_GE(sqnr_db(run_linear(nullptr, x, w, b, dy).grad_w, step2.grad_w), 17);
  commit_amax_histories(conversion, {});

  // A forward without grad (a sample grid, an evaluation) uses the history but records nothing.
  {
    at::NoGradGuard no_grad;
    delayed.linear(x * 1000, w, b);
  }
  EXPECT_EQ(delayed.pending_amax().abs().max().item<float>(), 0.0f);
}

TEST(Fp8, AmaxHistoriesRoundTripThroughTheirCheckpointStateAndSkippedStepsLeaveNoTrace) {
  const at::Tensor w = at::randn({8, 32}), b = at::zeros({8}), dy = at::randn({4, 8});
  auto make = [](int64_t len) { return std::make_shared<Fp8Linear>(Recipe::delayed, true, DelayedOptions{len, AmaxReduce::max}); };
  Fp8Conversion trained;
  trained.layers = {make(4)};
  trained.converted = {"blocks.0.mlp.fc1"};
  for (double gain : {1.0, 2.0, 3.0}) {  // three committed steps with growing inputs
    run_linear(trained.layers[0].get(), at::randn({4, 32}) * gain, w, b, dy);
    commit_amax_histories(trained, {});
  }
  const NamedTensors state = amax_history_state(trained);
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "blocks.0.mlp.fc1.amax_history");
  EXPECT_EQ(state[1].second.item<int64_t>(), 3);

  // A fresh layer given the state scales its next call exactly as the trained one does.
  Fp8Conversion resumed;
  resumed.layers = {make(4)};
  resumed.converted = trained.converted;
  EXPECT_EQ(restore_amax_histories(resumed, state), 1);
  const at::Tensor x = at::randn({4, 32}) * 2.5;
  EXPECT_TRUE(at::equal(run_linear(resumed.layers[0].get(), x, w, b, dy).y,
                        run_linear(trained.layers[0].get(), x, w, b, dy).y));

  // A shorter history keeps the newest rows; a layer the state does not name starts afresh.
  Fp8Conversion shorter;
  shorter.layers = {make(2), make(2)};
  shorter.converted = {"blocks.0.mlp.fc1", "blocks.0.mlp.fc2"};
  EXPECT_EQ(restore_amax_histories(shorter, state), 1);
  EXPECT_TRUE(at::equal(shorter.layers[0]->amax_history(), trained.layers[0]->amax_history().narrow(0, 0, 2)));
  EXPECT_EQ(shorter.layers[0]->amax_commits(), 3);
  EXPECT_EQ(shorter.layers[1]->amax_commits(), 0);

  // A skipped step's amaxes are dropped (an inf here would otherwise poison every later scale).
  Fp8Linear& layer = *resumed.layers[0];
  layer.restore_amax_history(trained.layers[0]->amax_history(), 3);
  const at::Tensor before = layer.amax_history().clone();
  run_linear(&layer, at::full({4, 32}, INFINITY), w, b, dy);
  EXPECT_TRUE(at::isinf(layer.pending_amax()[0]).item<bool>());
  discard_pending_amaxes(resumed);  // the trainer, for a skipped step: no commit follows
  EXPECT_EQ(layer.pending_amax().abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(at::equal(layer.amax_history(), before));

  // Malformed state names the layer.
  try {
    restore_amax_histories(resumed, {{"blocks.0.mlp.fc1.amax_history", at::zeros({4, 2})},
                                     {"blocks.0.mlp.fc1.amax_commits", at::scalar_tensor(1, at::kLong)}});
    FAIL() << "a [4, 2] history was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("blocks.0.mlp.fc1"), std::string::npos) << e.what();
  }
}

TEST(Fp8, ConversionTakesTheBlockLinearsAndKeepsParameterNames) {
  DiTOptions o = dit_size("S");
  o.depth = 2;
  o.input_size = 8;
  o.patch = 2;
  o.in_channels = 4;
  o.num_classes = 10;
  DiT plain(o), model(o);
  Fp8Options options;
  options.recipe = Recipe::tensorwise;
  options.emulate = true;
  options.include = {"blocks.*"};
  options.exclude = {"*adaLN_modulation*"};
  const Fp8Conversion c = convert_linears(*model, options);
  const std::vector<std::string> want = {"blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.mlp.fc1",
                                         "blocks.0.mlp.fc2",  "blocks.1.attn.qkv",  "blocks.1.attn.proj",
                                         "blocks.1.mlp.fc1",  "blocks.1.mlp.fc2"};
  EXPECT_EQ(c.converted, want);
  EXPECT_EQ(c.summary(options), "fp8 tensorwise (emulated): 8 linears converted [blocks.*.attn.qkv x2, "
                                "blocks.*.attn.proj x2, blocks.*.mlp.fc1 x2, blocks.*.mlp.fc2 x2]");
  EXPECT_EQ(plain->named_parameters().keys(), model->named_parameters().keys());  // checkpoints interchangeable
  // min_dim refuses small layers by name.
  options.min_dim = 2000;
  DiT small(o);
  const Fp8Conversion none = convert_linears(*small, options);
  EXPECT_TRUE(none.converted.empty());
  ASSERT_EQ(none.skipped.size(), 8u);
  EXPECT_EQ(none.skipped.front(), "blocks.0.attn.qkv (384->1152 below fp8.min_dim 2000)");
  EXPECT_TRUE(glob_match("*_mod.*", "double_blocks.0.img_mod.lin"));
  EXPECT_FALSE(glob_match("blocks.*", "text_encoder.blocks.0.qkv"));
}

TEST(Fp8, TheActivationCheckpointRecomputeGivesTheStoredGradients) {
  // Dynamic scales come from the recomputed tensors, which equal the forward's: the recompute
  // computes the same function, so the gradients match those of the stored activations.
  for (Recipe r : {Recipe::tensorwise, Recipe::rowwise, Recipe::delayed}) {
    SCOPED_TRACE(name(r));
    at::manual_seed(3);
    const at::Tensor x = at::randn({4, 4, 8, 8}), t = at::rand({4}), y = at::randint(0, 10, {4});
    DiT plain = flowtrain::test::perturbed_small_dit(2, 1), recomputed = flowtrain::test::perturbed_small_dit(2, 1);
    Fp8Options options;
    options.recipe = r;
    options.emulate = true;
    options.include = {"blocks.*"};
    convert_linears(*plain, options);
    convert_linears(*recomputed, options);
    recomputed->unit_runner = [](int64_t, const UnitCall& call, const Tensors& inputs) {
      return parallel::checkpointed_call(call, inputs);
    };
    plain->forward(x, t, y).pow(2).mean().backward();
    recomputed->forward(x, t, y).pow(2).mean().backward();
    const auto want = plain->named_parameters(), got = recomputed->named_parameters();
    for (const auto& item : want) {
      if (!item.value().grad().defined()) continue;  // fixed tables (pos_embed)
      // Same tolerance as the fp32 test of activation checkpointing: the conditioning path's
      // gradient sums the blocks' contributions in another order; fp32 summation order only.
      EXPECT_TRUE(at::allclose(got[item.key()].grad(), item.value().grad(), 1e-5, 1e-8)) << item.key();
    }
  }
}

TEST(Fp8, APrecastWeightGivesTheSameResultsAsCastingTheWeightAndItsDataIsNeverRead) {
  // FSDP's fp8 all-gather hands the linear the e4m3 bytes and inverse scale of W's tensorwise
  // cast (parallel/fsdp.h). Those are exactly what the linear's own cast makes of W, so every
  // output must be bit-identical; the weight parameter then carries only shape and gradient —
  // here it is all NaN, which any read (an amax, a GEMM) would spread into every result.
  const at::Tensor x = with_outliers({24, 48}, 5), w = with_outliers({40, 48}, 6), b = at::randn({40});
  const at::Tensor dy = at::randn({24, 40});
  Fp8Linear own(Recipe::tensorwise, true), given(Recipe::tensorwise, true);
  const LinearResult expected = run_linear(&own, x, w, b, dy);

  const std::shared_ptr<PrecastWeight> slot = given.gather_weight_in_fp8();
  EXPECT_EQ(given.gather_weight_in_fp8(), slot);  // one slot per layer
  const Quantized q = quantize_tensor(w, Format::e4m3, tensor_scale(abs_max(w), Format::e4m3));
  const at::Tensor nan_weight = at::full_like(w, std::numeric_limits<float>::quiet_NaN());
  EXPECT_THROW(run_linear(&given, x, nan_weight, b, dy), c10::Error);  // not gathered yet: refused
  slot->data = q.data;
  slot->inv_scale = q.inv_scale;
  const LinearResult got = run_linear(&given, x, nan_weight, b, dy);
  EXPECT_TRUE(at::equal(got.y, expected.y));
  EXPECT_TRUE(at::equal(got.grad_x, expected.grad_x));
  EXPECT_TRUE(at::equal(got.grad_w, expected.grad_w));
  EXPECT_TRUE(at::equal(got.grad_b, expected.grad_b));

  // Scales along the contracted axis (rowwise, MX) or from a history (delayed) cannot travel
  // with the gathered bytes.
  for (Recipe r : {Recipe::rowwise, Recipe::rowwise_gw_hp, Recipe::delayed, Recipe::mxfp8, Recipe::mxfp8_rceil}) {
    Fp8Linear other(r, true);
    EXPECT_THROW(other.gather_weight_in_fp8(), std::invalid_argument) << name(r);
  }
}
