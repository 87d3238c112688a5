// The fused CUDA kernels (models/kernels/cuda/cuda_fused.h) against their CPU references: the
// differentiable ops through the fused-op table (tests/fused_op_table.h: forward and backward
// against the float64 ATen composition, fp32, bf16 and fp16, odd and vectorised sizes, strided
// operands, outputs carved from NaN-filled blocks), and here the fp8 casts bit for bit against
// models/kernels/fp8_cast_reference.h, Flux's bf16 RmsNorm rounding and what the kernels take.
// Skipped without a GPU.
#include "fused_op_table.h"
#include "models/kernels/cuda/cuda_fused.h"
#include "models/kernels/fp8_cast_reference.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace fused = flowtrain::models::cuda_fused;
namespace ref = flowtrain::models::fp8_reference;

#define REQUIRE_CUDA_DEVICE() \
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device on this machine (gpu tests run on the GPU machine)"

#if !defined(FLOWTRAIN_HAVE_CUDA_KERNELS)

TEST(CudaFused, NotBuilt) { GTEST_SKIP() << "built without FLOWTRAIN_CUDA: no fused CUDA kernels"; }

#else

namespace {

std::string name(at::ScalarType dtype) {
  return dtype == at::kFloat ? "fp32" : dtype == at::kHalf ? "fp16" : "bf16";
}

bool bytes_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && at::equal(a.cpu().contiguous().view(at::kByte), b.cpu().contiguous().view(at::kByte));
}

// randn with 1% of the entries 50× larger, and the row `zero_row` all zeros.
at::Tensor with_outliers(int64_t M, int64_t K, int64_t zero_row = -1) {
  at::Tensor x = at::randn({M, K});
  x = at::where(at::rand({M, K}) < 0.01, x * 50, x);
  if (zero_row >= 0) x[zero_row].zero_();
  return x;
}

// A contiguous CUDA copy of x whose data starts one element past a 16-byte boundary: the
// unvectorised path.
at::Tensor misaligned_cuda(const at::Tensor& x) {
  at::Tensor buffer = at::empty({x.numel() + 1}, x.options().device(at::kCUDA));
  at::Tensor view = buffer.narrow(0, 1, x.numel()).view(x.sizes());
  view.copy_(x);
  return view;
}

}  // namespace

// One test per op of the table that has a CUDA kernel: every case in fp32, bf16 and fp16.
class CudaFusedOp : public ::testing::TestWithParam<std::string> {};
TEST_P(CudaFusedOp, MatchesTheFloat64Composition) {
  REQUIRE_CUDA_DEVICE();
  flowtrain::test::check_op_on_backend(GetParam(), "cuda");
}
INSTANTIATE_TEST_SUITE_P(Table, CudaFusedOp, ::testing::ValuesIn(flowtrain::test::ops_of_backend("cuda")),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(CudaFused, RmsNormRoundsLikeFluxInBf16) {
  // The ATen formula of models/flux/flux.cpp on the same device: the kernel rounds the normalised
  // value to bf16 before the weight as it does, so the two differ by at most one bf16 step.
  REQUIRE_CUDA_DEVICE();
  at::manual_seed(4);
  const at::Tensor x = at::randn({2, 3, 5, 128}, at::device(at::kCUDA).dtype(at::kBFloat16));
  const at::Tensor w = (1 + 0.1 * at::randn({128})).cuda();
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor flux = ((xf * at::rsqrt(xf.pow(2).mean(-1, true) + 1e-6)).to(at::kBFloat16) * w).to(at::kBFloat16);
  const at::Tensor out = fused::qk_rmsnorm(x, w);
  // rrms may differ in its last fp32 bit (summation order), which can move the rounded value one
  // bf16 step (≤ 2^-7 relative), and the product by w one more
  const at::Tensor step = flux.to(at::kFloat).abs() * std::ldexp(1.0, -6);
  EXPECT_TRUE(((out.to(at::kFloat) - flux.to(at::kFloat)).abs() <= step).all().item<bool>());
}

TEST(CudaFused, Fp8AmaxAndTensorwiseCastAreBitExact) {
  REQUIRE_CUDA_DEVICE();
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const int64_t numel : {int64_t(5 * 97), int64_t((1 << 20) + 3)}) {
      for (const bool aligned : {true, false}) {
        SCOPED_TRACE(name(dtype) + " numel " + std::to_string(numel) + (aligned ? "" : " misaligned"));
        at::manual_seed(5);
        const at::Tensor x = with_outliers(1, numel).view({numel}).to(dtype);
        const at::Tensor xc = aligned ? x.cuda() : misaligned_cuda(x);
        const at::Tensor amax = ref::amax(x);
        flowtrain::test::poison_cuda_blocks({4});
        EXPECT_EQ(fused::amax(xc).cpu().item<float>(), amax.item<float>());
        for (const at::ScalarType fp8 : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
          // twice the dynamic scale: the largest elements saturate
          const at::Tensor scale = at::div(at::full({}, 2 * ref::max_finite(fp8)), amax);
          at::Tensor history = at::full({4}, -1.0f, at::device(at::kCUDA));
          flowtrain::test::poison_cuda_blocks({numel});
          const at::Tensor y = fused::cast_to_fp8(xc, scale.cuda(), fp8, history[2]);
          EXPECT_EQ(y.scalar_type(), fp8);
          EXPECT_TRUE(bytes_equal(y, ref::cast_to_fp8(x, scale, fp8)));
          EXPECT_FALSE(at::isnan(y.to(at::kFloat)).any().item<bool>());
          EXPECT_EQ(history[2].item<float>(), amax.item<float>());  // the same pass's amax, in its slot
          EXPECT_EQ(history[1].item<float>(), -1.0f);
        }
      }
    }
  }
}

TEST(CudaFused, Fp8AmaxOfANanIsNanWhicheverItsSign) {
  REQUIRE_CUDA_DEVICE();
  // A NaN in the input surfaces as the amax, as in the reference (so a delayed-scaling history
  // shows it rather than hiding it behind the finite values), whichever its sign bit: one with
  // the bit set must not lose the kernel's integer atomic max to the finite values.
  for (const float nan : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()}) {
    at::Tensor x = at::randn({(1 << 16) + 5});
    x[777] = nan;
    SCOPED_TRACE(std::signbit(nan) ? "-NaN" : "+NaN");
    EXPECT_TRUE(std::isnan(ref::amax(x).item<float>()));
    flowtrain::test::poison_cuda_blocks({4});
    EXPECT_TRUE(std::isnan(fused::amax(x.cuda()).cpu().item<float>()));
  }
}

TEST(CudaFused, Fp8RowwiseCastIsBitExact) {
  REQUIRE_CUDA_DEVICE();
  struct Case {
    int64_t M, K;
  };
  // odd K (scalar path), a vectorised GEMM width, and rows longer than the register cache
  // (re-read: 40000 bf16 / 5001 unaligned fp32 elements)
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const Case c : {Case{7, 97}, Case{5, 3072}, Case{3, 40000}, Case{2, 5001}}) {
      for (const at::ScalarType fp8 : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
        SCOPED_TRACE(name(dtype) + " " + std::to_string(c.M) + "x" + std::to_string(c.K) +
                     (fp8 == at::kFloat8_e4m3fn ? " e4m3" : " e5m2"));
        at::manual_seed(6);
        const at::Tensor x = (with_outliers(c.M, c.K, /*zero_row=*/1) *
                              at::pow(10.0, at::arange(c.M, at::kFloat) - 2).unsqueeze(1)).to(dtype);
        flowtrain::test::poison_cuda_blocks({c.M * c.K, c.M * 4});
        const auto [y, inv] = fused::rowwise_cast_to_fp8(x.cuda(), fp8);
        const auto [want_y, want_inv] = ref::rowwise_cast_to_fp8(x, fp8);
        EXPECT_TRUE(bytes_equal(y, want_y));
        EXPECT_TRUE(bytes_equal(inv, want_inv)) << inv.cpu() << want_inv;
        EXPECT_EQ(inv[1].item<float>(), 1.0f);  // the zero row
        EXPECT_FALSE(at::isnan(y.to(at::kFloat)).any().item<bool>());
      }
    }
  }
  flowtrain::test::poison_cuda_blocks({64});
  const auto [empty, empty_inv] = fused::rowwise_cast_to_fp8(at::empty({3, 0}, at::device(at::kCUDA)), at::kFloat8_e4m3fn);
  EXPECT_TRUE(at::equal(empty_inv.cpu(), at::ones({3, 1})));  // K = 0: scale 1, not leftovers
}

TEST(CudaFused, Fp8MxBlockCastIsBitExact) {
  REQUIRE_CUDA_DEVICE();
  struct Case {
    int64_t M, K;
  };
  for (const ref::MxExponent rule : {ref::MxExponent::floor, ref::MxExponent::rceil})
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const Case c : {Case{3, 96}, Case{4, 4096}}) {
      for (const bool aligned : {true, false}) {
        SCOPED_TRACE(std::string(ref::name(rule)) + " " + name(dtype) + " " + std::to_string(c.M) + "x" +
                     std::to_string(c.K) + (aligned ? "" : " misaligned"));
        at::manual_seed(7);
        at::Tensor x = with_outliers(c.M, c.K) * 3;
        x[1].narrow(0, 32, 32).zero_();  // one all-zero block
        // blocks whose amax / 448 is subnormal (at and above 2^−127) and an exact power of two
        x[2].narrow(0, 0, 32).fill_(std::ldexp(448.0f, -130));
        x[2].narrow(0, 32, 32).fill_(std::ldexp(1.5f * 448.0f, -127));
        x[2].narrow(0, 64, 32).fill_(56.0f);
        x = x.to(dtype);
        flowtrain::test::poison_cuda_blocks({c.M * c.K, c.M * c.K / 32});
        const auto [y, e] = fused::mx_block_cast_to_fp8(aligned ? x.cuda() : misaligned_cuda(x), rule);
        const auto [want_y, want_e] = ref::mx_block_cast_to_fp8(x, rule);
        EXPECT_EQ(y.scalar_type(), at::kFloat8_e4m3fn);
        EXPECT_TRUE(bytes_equal(y, want_y));
        EXPECT_TRUE(bytes_equal(e, want_e));
        EXPECT_EQ(e[1][1].item<int>(), 0);
        EXPECT_FALSE(at::isnan(y.to(at::kFloat)).any().item<bool>());
      }
    }
  }
}

TEST(CudaFused, SupportsOnlyWhatTheKernelsTake) {
  // runs without a GPU: CPU tensors are never supported
  const at::Tensor x = at::randn({2, 3, 8}), v = at::randn({2, 8});
  EXPECT_FALSE(fused::supports_adaln_modulate(x, v, v));
  EXPECT_FALSE(fused::supports_gated_residual(x, v, x));
  EXPECT_FALSE(fused::supports_fp8_cast(x));
  EXPECT_THROW(fused::adaln_modulate(x, v, v, 1e-6), c10::Error);
  REQUIRE_CUDA_DEVICE();
  const at::Tensor xc = x.cuda(), vc = v.cuda();
  EXPECT_TRUE(fused::supports_adaln_modulate(xc, vc, vc));
  EXPECT_FALSE(fused::supports_adaln_modulate(xc.to(at::kDouble), vc, vc));
  EXPECT_FALSE(fused::supports_adaln_modulate(xc, vc.narrow(1, 0, 4), vc));
  EXPECT_FALSE(fused::supports_adaln_modulate(at::randn({2, 3, 4100}, xc.options()), vc, vc));
  EXPECT_FALSE(fused::supports_gated_residual(xc, vc, xc.to(at::kBFloat16)));
  // per-sample vectors of a dtype that promotes x's: the ATen composition's result would be fp32
  const at::Tensor xb = xc.to(at::kBFloat16), vb = vc.to(at::kBFloat16);
  EXPECT_FALSE(fused::supports_adaln_modulate(xb, vc, vc));
  EXPECT_FALSE(fused::supports_gated_residual(xb, vc, xb));
  EXPECT_FALSE(fused::supports_gated_residual(xc.to(at::kHalf), vb, xc.to(at::kHalf)));
  EXPECT_TRUE(fused::supports_adaln_modulate(xc, vb, vb));  // an exact upcast
  EXPECT_TRUE(fused::supports_gated_residual(xc, vb, xc));
  EXPECT_FALSE(fused::supports_rope(at::randn({1, 2, 3, 7}, xc.options()), at::randn({1, 3, 3, 2}, xc.options())));
  EXPECT_FALSE(fused::supports_qk_rmsnorm(at::randn({2, 300}, xc.options()), at::randn({300}, xc.options())));
  // Dh = 1 with a last-dim stride ≠ 1 counts as contiguous: supported, so it must not throw
  const at::Tensor odd = at::empty_strided({4, 1}, {1, 5}, xc.options()).normal_();
  ASSERT_TRUE(fused::supports_qk_rmsnorm(odd, at::ones({1}, xc.options())));
  EXPECT_NO_THROW(fused::qk_rmsnorm(odd, at::ones({1}, xc.options())));
  EXPECT_FALSE(fused::supports_mx_block_cast_to_fp8(at::randn({2, 40}, xc.options())));
}

#endif  // FLOWTRAIN_HAVE_CUDA_KERNELS
