// The ATen fp8 casts that the CUDA kernels (models/kernels/cuda/fp8_cast.cu) are checked against
// bit for bit: saturation, the power-of-two scale rules, MX block exponents, and round-trip
// accuracy against torchao's threshold (cast round trip ≥ 25 dB SQNR, docs/design/fp8.md).
#include "models/fp8/quantize.h"
#include "models/kernels/fp8_cast_reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace ref = flowtrain::models::fp8_reference;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

at::Tensor floats(const std::vector<float>& v) { return at::tensor(v, at::kFloat); }

std::vector<float> to_vector(const at::Tensor& t) {
  const at::Tensor f = t.to(at::kFloat).contiguous();
  return std::vector<float>(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
}

using flowtrain::models::fp8::sqnr_db;  // 20·log10(‖ref‖ / ‖ref − test‖), the library's measure

// randn with 1% of the entries 50× larger: the outliers that make per-tensor scaling hard.
at::Tensor with_outliers(int64_t M, int64_t K) {
  at::manual_seed(0);
  const at::Tensor x = at::randn({M, K});
  return at::where(at::rand({M, K}) < 0.01, x * 50, x);
}

bool any_nan(const at::Tensor& t) { return at::isnan(t.to(at::kFloat)).any().item<bool>(); }

}  // namespace

TEST(Fp8CastReference, E4m3SaturatesAt448) {
  const at::Tensor x = floats({1000, -1000, 448, 464, 470, 480, kInf, -kInf, 1, 0});
  const at::Tensor y = ref::cast_to_fp8(x, at::ones({}), at::kFloat8_e4m3fn);
  EXPECT_EQ(y.scalar_type(), at::kFloat8_e4m3fn);
  // 464 is halfway between 448 and 480 (not an e4m3fn value): ties to even, 448.
  EXPECT_EQ(to_vector(y), (std::vector<float>{448, -448, 448, 448, 448, 448, 448, -448, 1, 0}));
}

TEST(Fp8CastReference, E5m2SaturatesAt57344) {
  const at::Tensor x = floats({1e6f, -1e6f, 61440, 60000, 57344, kInf, -2.5f});
  const at::Tensor y = ref::cast_to_fp8(x, at::ones({}), at::kFloat8_e5m2);
  EXPECT_EQ(y.scalar_type(), at::kFloat8_e5m2);
  EXPECT_EQ(to_vector(y), (std::vector<float>{57344, -57344, 57344, 57344, 57344, 57344, -2.5f}));
}

TEST(Fp8CastReference, ScalesBeforeSaturatingAndTakesBf16) {
  const at::Tensor x = floats({1, -2, 300, 0.5f}).to(at::kBFloat16);
  const at::Tensor y = ref::cast_to_fp8(x, at::full({}, 2.0f), at::kFloat8_e4m3fn);
  EXPECT_EQ(to_vector(y), (std::vector<float>{2, -4, 448, 1}));
  EXPECT_THROW(ref::cast_to_fp8(x, at::ones({}), at::kFloat), c10::Error);
}

TEST(Fp8CastReference, AmaxIsMaxAbsAndPropagatesNaN) {
  EXPECT_EQ(ref::amax(floats({1, -3, 2})).item<float>(), 3.0f);
  EXPECT_EQ(ref::amax(floats({1, -3, 2})).dim(), 0);
  EXPECT_TRUE(std::isnan(ref::amax(floats({1, NAN, 2})).item<float>()));
  EXPECT_EQ(ref::amax(at::empty({0})).item<float>(), 0.0f);
}

TEST(Fp8CastReference, RowwiseScalesArePowersOfTwoAndNothingSaturates) {
  // rows spanning 1e-3 … 1e3, K = 97 (odd)
  at::manual_seed(1);
  const at::Tensor x = at::randn({7, 97}) * at::pow(10.0, at::arange(-3, 4, at::kFloat)).unsqueeze(1);
  for (const at::ScalarType dtype : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
    const double max = ref::max_finite(dtype);
    const auto [y, inv] = ref::rowwise_cast_to_fp8(x, dtype);
    ASSERT_EQ(inv.sizes(), (at::IntArrayRef{7, 1}));
    EXPECT_EQ(inv.scalar_type(), at::kFloat);
    const auto [mantissa, exponent] = at::frexp(inv);
    EXPECT_TRUE((mantissa == 0.5).all().item<bool>()) << "inverse scales are powers of two: " << inv;
    const at::Tensor scaled_amax = x.abs().amax(1, true) / inv;  // exact: a power of two
    // no element saturates, and the scale is the largest power of two that guarantees it
    EXPECT_TRUE((scaled_amax <= max).all().item<bool>());
    EXPECT_TRUE((scaled_amax > max / 2).all().item<bool>());
    // the row's largest element comes back within half a step of its format (2^-4 / 2^-3 relative)
    const double half_step = dtype == at::kFloat8_e4m3fn ? 1.0 / 16 : 1.0 / 8;
    const at::Tensor back = ref::dequantize_rowwise(y, inv).abs().amax(1, true);
    EXPECT_TRUE(((back - x.abs().amax(1, true)).abs() <= x.abs().amax(1, true) * half_step).all().item<bool>());
    EXPECT_FALSE(any_nan(y));
  }
}

TEST(Fp8CastReference, RowwiseZeroRowsStayZeroWithScaleOne) {
  at::Tensor x = at::randn({3, 40});
  x[1].zero_();
  const auto [y, inv] = ref::rowwise_cast_to_fp8(x, at::kFloat8_e4m3fn);
  EXPECT_EQ(inv[1].item<float>(), 1.0f);
  EXPECT_TRUE((y[1].to(at::kFloat) == 0).all().item<bool>());
  EXPECT_FALSE(any_nan(y));
  EXPECT_FALSE(any_nan(ref::dequantize_rowwise(y, inv)));
}

TEST(Fp8CastReference, MxExponentsOfKnownBlocks) {
  // Row 0: blocks with amax 3 (floor(log2) = 1), 448 (8) and 0; row 1: amax 1 (0), the float just
  // below 256 (7, where log2 in floats rounds to 8.0), 500 (8, and 500 saturates to 448).
  at::Tensor x = at::zeros({2, 96});
  x[0][0] = 3.0f;
  x[0][1] = -1.5f;
  x[0][32] = 448.0f;
  x[0][33] = 0.25f;
  x[1][0] = 1.0f;
  x[1][32] = std::nextafter(256.0f, 0.0f);
  x[1][64] = -500.0f;
  x[1][65] = 1.0f;
  const auto [y, e] = ref::mx_block_cast_to_fp8(x);
  ASSERT_EQ(e.sizes(), (at::IntArrayRef{2, 3}));
  EXPECT_EQ(e.scalar_type(), at::kByte);
  // stored = floor(log2(amax)) − 8 + 127; an all-zero block gets the smallest, 0 (2^−127)
  EXPECT_EQ(to_vector(e), (std::vector<float>{120, 127, 0, 119, 126, 127}));
  const std::vector<float> v = to_vector(y);
  EXPECT_EQ(v[0], 384.0f);   // 3 · 2^7
  EXPECT_EQ(v[1], -192.0f);  // −1.5 · 2^7
  EXPECT_EQ(v[32], 448.0f);
  EXPECT_EQ(v[33], 0.25f);
  EXPECT_EQ(v[64 + 96], -448.0f);  // saturated
  EXPECT_EQ(v[96], 256.0f);        // 1 · 2^8
  const std::vector<float> scales = to_vector(ref::e8m0_to_float(e));
  EXPECT_EQ(scales[0], std::ldexp(1.0f, -7));
  EXPECT_EQ(scales[2], std::ldexp(1.0f, -127));
  // the round trip of exact values is exact
  EXPECT_EQ(ref::dequantize_mx(y, e)[0][0].item<float>(), 3.0f);
  EXPECT_THROW(ref::mx_block_cast_to_fp8(at::zeros({2, 40})), c10::Error);
}

TEST(Fp8CastReference, MxRceilExponentsOfKnownBlocks) {
  // shared_exp = ceil(log2(amax / 448)); per block of row 0: amax 3, 500 (floor saturates it),
  // 448 / 8 = 56 (a quotient exactly 2^−3), 0; row 1: 448·2^−130 and 1.5·448·2^−127, whose
  // quotients are subnormal floats at and above 2^−127, and 449.
  at::Tensor x = at::zeros({2, 128});
  x[0][0] = 3.0f;
  x[0][32] = -500.0f;
  x[0][33] = 1.0f;
  x[0][64] = 56.0f;
  x[1][0] = std::ldexp(448.0f, -130);
  x[1][32] = std::ldexp(1.5f * 448.0f, -127);
  x[1][64] = 449.0f;
  const auto [y, e] = ref::mx_block_cast_to_fp8(x, ref::MxExponent::rceil);
  // stored = shared_exp + 127: −7, 1, −3, and −127 for the zero block; −127 (q = 2^−130: below the
  // clamp), −126 (q = 1.5·2^−127), 1 (449 / 448 rounds up to 2), and the last zero block
  EXPECT_EQ(to_vector(e), (std::vector<float>{120, 128, 124, 0, 0, 1, 128, 0}));
  const std::vector<float> v = to_vector(y);
  EXPECT_EQ(v[0], 384.0f);   // 3 · 2^7, as floor gives
  EXPECT_EQ(v[32], -256.0f);  // −500 / 2 = −250 rounds to −256 (e4m3's step is 16 there): not clipped to −448
  EXPECT_EQ(v[33], 0.5f);
  EXPECT_EQ(v[64], 448.0f);   // an exact power-of-two quotient lands on 448, not 224
  EXPECT_EQ(v[128], 448.0f * 0.125f);  // 448·2^−130 · 2^127
  EXPECT_EQ(v[128 + 32], 320.0f);  // 1.5·448 / 2 = 336, halfway between 320 and 352: to the even mantissa
  EXPECT_EQ(v[128 + 64], 224.0f);  // 449 / 2 = 224.5 → 224 (step 16)
  const auto [fy, fe] = ref::mx_block_cast_to_fp8(x, ref::MxExponent::floor);
  EXPECT_EQ(to_vector(fy)[32], -448.0f);  // the OCP rule clips the same block

  // A non-finite amax never passes for a finite one: the inf comes out NaN (the floor rule
  // instead saturates it to 448) and the rest of its block 0; the blocks beside it are untouched.
  at::Tensor bad = at::ones({1, 64});
  bad[0][0] = kInf;
  const auto [by, be] = ref::mx_block_cast_to_fp8(bad, ref::MxExponent::rceil);
  EXPECT_TRUE(std::isnan(to_vector(by)[0]));
  EXPECT_EQ(to_vector(by)[1], 0.0f);
  EXPECT_EQ(to_vector(by)[32], 256.0f);  // 1 in a block of amax 1: 2^−(ceil(log2(1/448))) = 2^8
}

// The rule against float64 on blocks spread over 2^±40: the exponent is ceil(log2(q)) of the
// fp32 quotient q = amax / 448, and it is the smallest that saturates nothing — with exponent − 1
// the amax would exceed 448 (up to q's one rounding, which the comparison uses too).
TEST(Fp8CastReference, MxRceilIsTheSmallestExponentThatSaturatesNothing) {
  at::manual_seed(3);
  const int64_t M = 64, K = 32 * 64;
  const at::Tensor magnitude = at::randint(-40, 41, {M, K / 32, 1}).to(at::kFloat).exp2();
  const at::Tensor x = (with_outliers(M, K).reshape({M, K / 32, 32}) * magnitude).reshape({M, K});
  const auto [y, e] = ref::mx_block_cast_to_fp8(x, ref::MxExponent::rceil);
  const at::Tensor a = x.abs().reshape({M, K / 32, 32}).amax(2).contiguous();
  const float* amax = a.data_ptr<float>();
  const at::Tensor stored = e.to(at::kInt).contiguous();
  const int* got = stored.data_ptr<int>();
  int64_t checked = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float q = amax[i] / 448.0f;  // one correctly rounded fp32 division
    const int want = int(std::ceil(std::log2(double(q))));  // q is a normal float here: log2 in doubles is exact enough
    ASSERT_EQ(got[i] - 127, want) << "block " << i << " amax " << amax[i];
    EXPECT_LE(double(amax[i]) * std::ldexp(1.0, -want), 448.0 * (1 + std::ldexp(1.0, -23)));
    EXPECT_GT(double(q) * std::ldexp(1.0, -(want - 1)), 1.0);  // one binade less would clip
    ++checked;
  }
  EXPECT_EQ(checked, M * K / 32);
  // and the elements are x·2^−e rounded, never clamped: the round trip is as good as e4m3 allows
  EXPECT_GE(sqnr_db(x, ref::dequantize_mx(y, e)), 25.0);
}

TEST(Fp8CastReference, RoundTripSqnrOnRandnWithOutliers) {
  const at::Tensor x = with_outliers(64, 256);
  const at::Tensor amax = ref::amax(x);
  for (const at::ScalarType in : {at::kFloat, at::kBFloat16}) {
    const at::Tensor xi = x.to(in);
    // e4m3 (3 mantissa bits): ~30 dB whatever the scaling; torchao's bar for a cast round trip is 25
    const at::Tensor scale = 448.0f / amax;
    const double tensorwise = sqnr_db(xi, ref::cast_to_fp8(xi, scale, at::kFloat8_e4m3fn).to(at::kFloat) / scale);
    const auto [ry, rinv] = ref::rowwise_cast_to_fp8(xi, at::kFloat8_e4m3fn);
    const double rowwise = sqnr_db(xi, ref::dequantize_rowwise(ry, rinv));
    const auto [my, me] = ref::mx_block_cast_to_fp8(xi);
    const double mx = sqnr_db(xi, ref::dequantize_mx(my, me));
    const auto [cy, ce] = ref::mx_block_cast_to_fp8(xi, ref::MxExponent::rceil);
    const double mx_rceil = sqnr_db(xi, ref::dequantize_mx(cy, ce));
    EXPECT_GE(tensorwise, 25.0) << in;
    EXPECT_GE(rowwise, 25.0) << in;
    EXPECT_GE(mx, 25.0) << in;
    EXPECT_GE(mx_rceil, 25.0) << in;
    // e5m2 (2 mantissa bits) is ~6 dB worse: the gradients' format, for range, not precision
    const at::Tensor scale5 = 57344.0f / amax;
    const double e5m2 = sqnr_db(xi, ref::cast_to_fp8(xi, scale5, at::kFloat8_e5m2).to(at::kFloat) / scale5);
    EXPECT_GE(e5m2, 19.0) << in;
    EXPECT_LT(e5m2, tensorwise) << in;
  }
}

TEST(Fp8CastReference, ZerosStayZeroWithoutNaN) {
  const at::Tensor x = at::zeros({4, 64});
  const at::Tensor amax = ref::amax(x);
  EXPECT_EQ(amax.item<float>(), 0.0f);
  // the dynamic scale max / max(amax, 1e-12) is finite for an all-zero tensor
  const at::Tensor scale = 448.0f / amax.clamp_min(1e-12);
  const at::Tensor t = ref::cast_to_fp8(x, scale, at::kFloat8_e4m3fn);
  const auto [ry, rinv] = ref::rowwise_cast_to_fp8(x, at::kFloat8_e5m2);
  const auto [my, me] = ref::mx_block_cast_to_fp8(x);
  const auto [cy, ce] = ref::mx_block_cast_to_fp8(x, ref::MxExponent::rceil);
  EXPECT_TRUE((ce == 0).all().item<bool>());
  for (const at::Tensor& q : {t, ry, my, cy}) {
    EXPECT_TRUE((q.to(at::kFloat) == 0).all().item<bool>());
    EXPECT_FALSE(any_nan(q));
  }
  EXPECT_FALSE(any_nan(ref::dequantize_rowwise(ry, rinv)));
  EXPECT_FALSE(any_nan(ref::dequantize_mx(my, me)));
  EXPECT_TRUE((me == 0).all().item<bool>());
}
