// The fp8 linear on the GPU: at::_scaled_mm (cuBLASLt's fp8 tensor cores) against the emulation of
// the same recipe, FSDP's precast weight against the linear's own cast, and a sharded run that
// all-gathers its weights in fp8 on NCCL. Skipped (with the reason) without a device of compute
// capability ≥ 8.9.
#include "cli_runner.h"
#include "models/autocast_region.h"
#include "models/fp8/fp8_linear.h"
#include "models/fp8/quantize.h"
#include "test_util.h"

#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>

using namespace flowtrain::models;
using namespace flowtrain::models::fp8;

#define REQUIRE_FP8_GPU()                                                                              \
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device on this machine (gpu tests run on the GPU machine)"; \
  if (at::cuda::getCurrentDeviceProperties()->major * 10 + at::cuda::getCurrentDeviceProperties()->minor < 89) \
  GTEST_SKIP() << "no fp8 tensor cores (compute capability < 8.9)"

namespace {
struct LinearResult {
  at::Tensor y, grad_x, grad_w, grad_b;
};
LinearResult run_linear(LinearCompute& compute, const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& b0,
                        const at::Tensor& dy) {
  at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
  at::Tensor y = compute.linear(x, w, b);
  y.backward(dy.to(y.scalar_type()));
  return {y.detach().to(at::kFloat), x.grad(), w.grad(), b.grad()};
}
at::Tensor with_outliers(std::vector<int64_t> shape, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor x = at::randn(shape);
  return at::where(at::rand(shape) < 0.001, x * 30, x).cuda();
}
}  // namespace

TEST(CudaFp8, HardwareGemmsMatchTheEmulationOfTheSameRecipe) {
  REQUIRE_FP8_GPU();
  // Features multiples of 16 (what conversion requires for the hardware path), 4×33 = 132
  // tokens: the weight-gradient GEMM contracts over tokens, so its K is padded to 144. Both
  // sides quantise the same operands with the same scales; they differ by accumulation (the
  // forward's fast accumulation on Hopper, summation order) and, for row scaling and the bf16
  // GEMM, the bf16 output both round to. The bar for an fp8 GEMM against its emulation is
  // 25 dB; equal operands should give far more.
  const at::Tensor x = with_outliers({4, 33, 96}, 1), w = with_outliers({80, 96}, 2) * 0.1, b = at::randn({80}).cuda();
  const at::Tensor dy = with_outliers({4, 33, 80}, 3);
  for (Recipe r : {Recipe::tensorwise, Recipe::rowwise, Recipe::rowwise_gw_hp, Recipe::delayed}) {
    Fp8Linear hardware(r, /*emulate=*/false), emulated(r, /*emulate=*/true);
    const LinearResult h = run_linear(hardware, x, w, b, dy), e = run_linear(emulated, x, w, b, dy);
    SCOPED_TRACE(name(r));
    std::printf("[fp8 gpu] %s: SQNR hardware vs emulation: y %.1f dB, grad_x %.1f dB, grad_w %.1f dB\n", name(r),
                sqnr_db(e.y, h.y), sqnr_db(e.grad_x, h.grad_x), sqnr_db(e.grad_w, h.grad_w));
    EXPECT_GE(sqnr_db(e.y, h.y), 25);
    EXPECT_GE(sqnr_db(e.grad_x, h.grad_x), 25);
    EXPECT_GE(sqnr_db(e.grad_w, h.grad_w), 25);
    EXPECT_TRUE(at::isfinite(h.grad_w).all().item<bool>());
  }
}

TEST(CudaFp8, APrecastWeightGivesBitIdenticalHardwareResults) {
  REQUIRE_FP8_GPU();
  // FSDP's fp8 all-gather hands the linear the bytes of W's own tensorwise cast: the hardware
  // GEMMs then see identical operands (forward: W; ∂x: Wᵀ, the transposed bytes made contiguous),
  // in fp32 and under bf16 autocast alike. The parameter itself is NaN: never read.
  const at::Tensor x = with_outliers({4, 33, 96}, 4), w = with_outliers({80, 96}, 5) * 0.1, b = at::randn({80}).cuda();
  const at::Tensor dy = with_outliers({4, 33, 80}, 6);
  for (bool bf16 : {false, true}) {
    AutocastRegion autocast(bf16, c10::kCUDA);
    Fp8Linear own(Recipe::tensorwise, false), given(Recipe::tensorwise, false);
    const LinearResult expected = run_linear(own, x, w, b, dy);
    const Quantized q = quantize_tensor(w, Format::e4m3, tensor_scale(abs_max(w), Format::e4m3));
    const std::shared_ptr<PrecastWeight> slot = given.gather_weight_in_fp8();
    slot->data = q.data;
    slot->inv_scale = q.inv_scale;
    const LinearResult got = run_linear(given, x, at::full_like(w, std::numeric_limits<float>::quiet_NaN()), b, dy);
    SCOPED_TRACE(bf16 ? "bf16 autocast" : "fp32");
    EXPECT_TRUE(at::equal(got.y, expected.y));
    EXPECT_TRUE(at::equal(got.grad_x, expected.grad_x));
    EXPECT_TRUE(at::equal(got.grad_w, expected.grad_w));
  }
}

TEST(CudaFp8, ShardedRunGatheringWeightsInFp8OnNcclTrainsLikeGatheringThenCasting) {
  REQUIRE_FP8_GPU();
  // World 1 with FSDP on (the NCCL all-gather of e4m3 bytes, the device cast of the master slice,
  // the precast hardware GEMMs), fp32 compute without TF32: the same bytes as gathering fp32
  // and casting, so the two runs agree up to the GPU's own run-to-run differences (atomics in
  // some backward kernels), far below what a wrong scale or a stale gather does (percent).
  const std::vector<std::string> common = {"run.device=cuda", "train.tf32=false", "train.steps=20", "train.log_every=1",
                                           "fp8.recipe=tensorwise", "parallel.fsdp=on", "train.tensorboard=false"};
  const std::string base = flowtrain::test::scratch_dir("fp8_all_gather_gpu");
  auto gathered = common;
  gathered.push_back("fp8.all_gather=true");
  auto r = flowtrain::test::train_tiny(base + "/cast_after_gather", common);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = flowtrain::test::train_tiny(base + "/gather_fp8", gathered);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fp8 all-gather: the"), std::string::npos) << r.output;
  const auto a = flowtrain::test::read_metrics(base + "/cast_after_gather"), g = flowtrain::test::read_metrics(base + "/gather_fp8");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(g.size(), 20u);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i]["loss"].get<double>() - g[i]["loss"].get<double>()) / a[i]["loss"].get<double>());
  std::printf("[fp8 gpu] fp8 all-gather vs gather then cast, 20 steps: largest loss rel diff %.3g\n", worst);
  EXPECT_LE(worst, 1e-3);
}
