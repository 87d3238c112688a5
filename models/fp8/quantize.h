// FP8 quantisation as the fp8 GEMMs see it (docs/design/fp8.md): a tensor is scaled so its
// largest magnitude lands on the format's largest finite value, saturating-cast to 8 bits, and
// carried with the inverse scale that turns it back (x ≈ data · inv_scale).
//
// Every operand here is 2-D and quantised for a GEMM that contracts its dim 1, so "per row" and
// "per 32-element block" always run along dim 1; the other GEMMs of a linear's backward quantise
// a transposed copy (scaled_gemm.h says which).
#pragma once

#include "models/kernels/fp8_cast_reference.h"

#include <ATen/ATen.h>

#include <string>

namespace flowtrain::models::fp8 {

enum class Format { e4m3, e5m2 };  // OCP e4m3fn (max 448, no inf) / e5m2 (max 57344)
double max_finite(Format format);
at::ScalarType scalar_type(Format format);
const char* name(Format format);

enum class Scaling {
  tensor,   // one scale for the whole tensor (dynamic: from its amax; delayed: from a history)
  row,      // one power-of-two scale per row (torchao "rowwise": amax over the contracted dim)
  block32,  // MX: one power-of-two (e8m0) scale per 32 consecutive elements of a row
};
const char* name(Scaling scaling);
constexpr int64_t kMxBlock = 32;
// block32's shared-exponent rule: the OCP floor or NVIDIA's round-up (fp8_cast_reference.h).
using MxExponent = fp8_reference::MxExponent;

struct Quantized {
  at::Tensor data;       // fp8, the source's shape [M, K]
  at::Tensor inv_scale;  // fp32: [] (tensor), [M, 1] (row) or [M, K/32] (block32)
  Format format = Format::e4m3;
  Scaling scaling = Scaling::tensor;
  at::Tensor dequantize() const;  // fp32 [M, K]
};

// x [M, K] with K zero-padded up to a multiple of `multiple` (MX blocks: 32; hardware fp8 GEMMs:
// 16). Zeros add nothing to a dot product and never set an amax, so the GEMM is unchanged.
at::Tensor pad_contracted(const at::Tensor& x, int64_t multiple);

// The dynamic per-tensor scale max_finite / max(amax, 1e-12), fp32 (a 0-dim tensor, on amax's device).
at::Tensor tensor_scale(const at::Tensor& amax, Format format);
// |x|.max() as a 0-dim fp32 tensor.
at::Tensor abs_max(const at::Tensor& x);

// The casts saturate: clamp(x·scale, ±max_finite), then round to nearest even (ATen's plain cast
// turns e4m3fn overflow into NaN); NaN stays NaN. Their exact rules and the CUDA kernels that
// run them on GPU tensors: models/kernels/fp8_cast_reference.h, models/kernels/cuda/fp8_cast.cu.
// x [M, K] quantised with the given 0-dim scale (dynamic or delayed).
Quantized quantize_tensor(const at::Tensor& x, Format format, const at::Tensor& scale);
// x [M, K] with per-row scales 2^floor(log2(max_finite / amax_row)): powers of two, so scaling
// is exact and the scale itself adds no rounding. All-zero rows get scale 1.
Quantized quantize_rows(const at::Tensor& x, Format format);
// x [M, K], K % 32 == 0: OCP MX e4m3 blocks — shared exponent floor(log2(amax_block)) − 8
// (8 = e4m3's largest exponent) or, with rceil, ceil(log2(amax_block / 448)), clamped to e8m0's
// [−127, 127], elements x / 2^exp saturated.
Quantized quantize_blocks(const at::Tensor& x, MxExponent rule = MxExponent::floor);

// What a cast lost, measured on the source x and its quantisation q: the fraction of elements
// that were clipped (|x·scale| > max_finite) and of non-zero elements flushed to zero.
struct CastStats {
  double saturated = 0, underflow = 0;
  int64_t numel = 0;
};
CastStats cast_stats(const at::Tensor& x, const Quantized& q);

// Signal-to-quantisation-noise ratio 20·log10(‖ref‖ / ‖ref − test‖) in dB (float64), +inf when equal.
double sqnr_db(const at::Tensor& reference, const at::Tensor& test);

}  // namespace flowtrain::models::fp8
