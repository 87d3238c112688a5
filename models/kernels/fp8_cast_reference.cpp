#include "models/kernels/fp8_cast_reference.h"

#include <c10/util/Exception.h>

#include <cmath>

namespace flowtrain::models::fp8_reference {
namespace {

constexpr int kE4m3MaxExponent = 8;   // 448 = 1.75 · 2^8
constexpr int kMxBlock = 32;

// 2^e for integer tensors e with −126 ≤ e ≤ 127: the float whose exponent field is e + 127.
at::Tensor pow2(const at::Tensor& e) { return at::bitwise_left_shift(e + 127, 23).view(at::kFloat); }

// floor(log2(v)) + 127 for fp32 v ≥ 0: the biased exponent field (0 for zero and subnormals).
at::Tensor biased_exponent(const at::Tensor& v) {
  return at::bitwise_and(at::bitwise_right_shift(v.contiguous().view(at::kInt), 23), 0xff);
}

// ceil(log2(q)) for fp32 q ≥ 0 from its bits, kept ≥ −127 (the clamp every caller applies):
// a normal q is 2^(E−127)·1.m, so E − 127 plus one unless the mantissa is zero; a subnormal
// q = m·2^−149 is above 2^−127 (ceil −126) exactly when m > 2^22; 0 gives −127. NaN / inf
// give 129 / 128 (the callers clamp to 127).
at::Tensor ceil_log2(const at::Tensor& q) {
  const at::Tensor e = biased_exponent(q);
  const at::Tensor m = at::bitwise_and(q.contiguous().view(at::kInt), 0x7fffff);
  const at::Tensor normal = e - 127 + (m != 0).to(at::kInt);
  const at::Tensor subnormal = at::where(m > (1 << 22), -126, -127).to(at::kInt);
  return at::where(e == 0, subnormal, normal);
}

at::Tensor saturate(const at::Tensor& scaled, at::ScalarType fp8_dtype) {
  const double m = max_finite(fp8_dtype);
  return scaled.clamp(-m, m).to(fp8_dtype);
}

void check_2d(const at::Tensor& x, const char* what) {
  TORCH_CHECK(x.dim() == 2 && at::isFloatingType(x.scalar_type()), "fp8_reference::", what,
              ": a 2-D floating tensor expected, got ", x.scalar_type(), " ", x.sizes());
}

}  // namespace

double max_finite(at::ScalarType fp8_dtype) {
  if (fp8_dtype == at::kFloat8_e4m3fn) return 448.0;
  TORCH_CHECK(fp8_dtype == at::kFloat8_e5m2, "fp8_reference: Float8_e4m3fn or Float8_e5m2 expected, got ", fp8_dtype);
  return 57344.0;
}

at::Tensor amax(const at::Tensor& x) {
  if (x.numel() == 0) return at::zeros({}, x.options().dtype(at::kFloat));
  return x.abs().amax().to(at::kFloat);
}

at::Tensor cast_to_fp8(const at::Tensor& x, const at::Tensor& scale, at::ScalarType fp8_dtype) {
  TORCH_CHECK(scale.numel() == 1, "fp8_reference::cast_to_fp8: a one-element scale expected, got ", scale.sizes());
  return saturate(x.to(at::kFloat) * scale.to(at::kFloat).reshape({}), fp8_dtype);
}

std::pair<at::Tensor, at::Tensor> rowwise_cast_to_fp8(const at::Tensor& x, at::ScalarType fp8_dtype) {
  check_2d(x, "rowwise_cast_to_fp8");
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor a = xf.abs().amax(1, /*keepdim=*/true);  // [M, 1]
  // max_finite / max(a, 1e-12) as one fp32 division (a scalar numerator would become a
  // reciprocal and a multiplication in ATen: two roundings).
  const at::Tensor q = at::div(at::full_like(a, max_finite(fp8_dtype)), at::where(a > kAmaxFloor, a, kAmaxFloor));
  const at::Tensor e = (biased_exponent(q) - 127).clamp(-126, 126);
  const at::Tensor nonzero = a > 0;  // false for 0 and NaN: scale 1
  const at::Tensor scale = at::where(nonzero, pow2(e), 1.0);
  const at::Tensor inv_scale = at::where(nonzero, pow2(-e), 1.0);
  return {saturate(xf * scale, fp8_dtype), inv_scale};
}

const char* name(MxExponent rule) { return rule == MxExponent::floor ? "floor" : "rceil"; }

std::pair<at::Tensor, at::Tensor> mx_block_cast_to_fp8(const at::Tensor& x, MxExponent rule) {
  check_2d(x, "mx_block_cast_to_fp8");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K % kMxBlock == 0, "fp8_reference::mx_block_cast_to_fp8: K = ", K, " is not a multiple of 32");
  const at::Tensor blocks = x.to(at::kFloat).reshape({M, K / kMxBlock, kMxBlock});
  const at::Tensor a = blocks.abs().amax(2);  // [M, K/32]
  const at::Tensor shared_exp =
      (rule == MxExponent::floor ? biased_exponent(a) - 127 - kE4m3MaxExponent : ceil_log2(a / 448.0f)).clamp(-127, 127);
  // 2^−shared_exp: a normal float for every finite amax (shared_exp ≤ 120); a NaN or inf amax under
  // rceil clamps to 127 and pow2 gives 0: its non-finite elements come out NaN (inf·0), the rest 0
  const at::Tensor data = saturate(blocks * pow2(-shared_exp).unsqueeze(2), at::kFloat8_e4m3fn).reshape({M, K});
  return {data, (shared_exp + 127).to(at::kByte)};
}

at::Tensor e8m0_to_float(const at::Tensor& exponents) {
  const at::Tensor e = exponents.to(at::kInt);
  // exponent field 0 would read as 0.0: 2^−127 is the subnormal 2^−126 / 2
  return at::where(e == 0, std::ldexp(1.0, -127), at::bitwise_left_shift(e, 23).view(at::kFloat));
}

at::Tensor dequantize_rowwise(const at::Tensor& data, const at::Tensor& inv_scale) {
  return data.to(at::kFloat) * inv_scale;
}

at::Tensor dequantize_mx(const at::Tensor& data, const at::Tensor& exponents) {
  const int64_t M = data.size(0), K = data.size(1);
  const at::Tensor values = data.to(at::kFloat).reshape({M, K / kMxBlock, kMxBlock});
  return (values * e8m0_to_float(exponents).unsqueeze(2)).reshape({M, K});
}

}  // namespace flowtrain::models::fp8_reference
