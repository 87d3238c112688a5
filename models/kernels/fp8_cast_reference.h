#pragma once
// The fp8 casts of models/kernels/cuda/fp8_cast.cu written in ATen (CPU or any device): the
// reference the CUDA kernels are tested against bit for bit (tests/gpu/test_cuda_fused.cpp), and a
// fallback where they do not apply. Every step is an exactly rounded fp32 operation or exact bit
// manipulation, so the two agree to the bit:
//   - the scaled value is fp32 x·scale (x converted exactly from bf16/fp16), then clamped to
//     ±max_finite and converted with round-to-nearest-even (ATen's CPU cast does not saturate:
//     e4m3fn overflow becomes NaN, hence the clamp; NaN stays NaN);
//   - floor(log2(·)) of a power-of-two scale is read from the float's exponent bits, not from
//     log2, whose rounding can land on the next integer just below a power of two.
#include <ATen/ATen.h>

#include <utility>

namespace flowtrain::models::fp8_reference {

// ±448 (at::kFloat8_e4m3fn) or ±57344 (at::kFloat8_e5m2); throws for any other dtype.
double max_finite(at::ScalarType fp8_dtype);

// The smallest amax a scale is computed from (as a float, 1e-12f: the CUDA kernels' floor), so an
// all-zero tensor or row gets a finite scale.
inline constexpr double kAmaxFloor = 1e-12;

// max|x| as a 0-dim fp32 tensor (NaN propagates; 0 for an empty tensor).
at::Tensor amax(const at::Tensor& x);

// clamp(x·scale, ±max_finite) → fp8_dtype, x's shape; scale a 0-dim (or 1-element) fp32 tensor.
at::Tensor cast_to_fp8(const at::Tensor& x, const at::Tensor& scale, at::ScalarType fp8_dtype);

// x [M, K] → (fp8 [M, K], inverse scales [M, 1] fp32). Per row, with a = max|x_row|:
// scale = 2^e, e = floor(log2(max_finite / max(a, 1e-12))) kept to [−126, 126] (a normal float,
// as is 1/scale); rows with a = 0 or NaN keep scale 1. Powers of two: scaling is exact, and no
// finite element saturates (a·scale ≤ max_finite).
std::pair<at::Tensor, at::Tensor> rowwise_cast_to_fp8(const at::Tensor& x, at::ScalarType fp8_dtype);

// How an MX block's shared exponent follows from its amax a (e4m3 elements, max 448 = 1.75·2^8):
//   floor  OCP MX v1.0: floor(log2(a)) − 8. A block whose amax mantissa exceeds 1.75 lands above
//          448, so its largest elements saturate (0.7–2.7 % of a trained model's elements).
//   rceil  NVIDIA's choice (cuBLAS block quantisation, Blackwell's cvt.rp…ue8m0): the fp32
//          quotient q = a / 448 rounded up to a power of two, ceil(log2(q)) — the smallest scale
//          that keeps the whole block ≤ 448, so nothing saturates (up to the one rounding of q),
//          at the cost of one binade of resolution for blocks floor would have clipped.
enum class MxExponent { floor, rceil };
const char* name(MxExponent rule);

// OCP MX (e4m3 elements, e8m0 scales): x [M, K], K % 32 == 0 → (e4m3 [M, K], exponents uint8
// [M, K/32]). Per 32 consecutive elements of a row with a = max|block|: shared_exp by `rule`
// (above) clamped to [−127, 127] (a = 0, or tiny, gives −127: zeros stay zero), elements
// saturate(x · 2^−shared_exp), stored exponent shared_exp + 127 (e8m0's bias; x ≈ element ·
// 2^(stored − 127)).
std::pair<at::Tensor, at::Tensor> mx_block_cast_to_fp8(const at::Tensor& x, MxExponent rule = MxExponent::floor);

// The values back in fp32: data · inv_scale (rowwise), element · 2^(exponent − 127) per block (MX).
at::Tensor dequantize_rowwise(const at::Tensor& data, const at::Tensor& inv_scale);
at::Tensor dequantize_mx(const at::Tensor& data, const at::Tensor& exponents);

// e8m0 exponents (uint8) → their fp32 values 2^(e − 127) [M, K/32] (the inverse scales models/fp8
// keeps for block32). Exact: 2^−127 is a subnormal float, 255 (NaN in e8m0) is never produced.
at::Tensor e8m0_to_float(const at::Tensor& exponents);

}  // namespace flowtrain::models::fp8_reference
