#include "models/fp8/quantize.h"

#include "models/kernels/cuda/cuda_fused.h"
#include "models/kernels/fp8_cast_reference.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace flowtrain::models::fp8 {

at::ScalarType scalar_type(Format format) {
  return format == Format::e4m3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
}
double max_finite(Format format) { return fp8_reference::max_finite(scalar_type(format)); }
const char* name(Format format) { return format == Format::e4m3 ? "e4m3" : "e5m2"; }
const char* name(Scaling scaling) {
  switch (scaling) {
    case Scaling::tensor: return "tensor";
    case Scaling::row: return "row";
    case Scaling::block32: return "block32";
  }
  return "?";
}

namespace {
using fp8_reference::kAmaxFloor;  // an all-zero tensor gets a finite scale

void check_2d(const at::Tensor& x, const char* what) {
  if (x.dim() != 2) throw std::invalid_argument(std::string("fp8 ") + what + ": expected a 2-D tensor, got " + std::to_string(x.dim()) + "-D");
}
}  // namespace

// The cast rules live once, in models/kernels/fp8_cast_reference.h (exactly rounded ATen, bit
// for bit what the CUDA kernels compute); CUDA tensors take the fused one-pass kernels.
at::Tensor pad_contracted(const at::Tensor& x, int64_t multiple) {
  const int64_t k = x.size(1), padded = (k + multiple - 1) / multiple * multiple;
  return padded == k ? x : at::constant_pad_nd(x, {0, padded - k});
}

at::Tensor abs_max(const at::Tensor& x) {
  return cuda_fused::supports_fp8_cast(x) ? cuda_fused::amax(x) : fp8_reference::amax(x);
}

at::Tensor tensor_scale(const at::Tensor& amax_value, Format format) {
  return (max_finite(format) / amax_value.to(at::kFloat).clamp_min(kAmaxFloor)).to(at::kFloat);
}

Quantized quantize_tensor(const at::Tensor& x, Format format, const at::Tensor& scale) {
  check_2d(x, "quantize_tensor");
  const at::Tensor s = scale.to(at::kFloat);
  const at::Tensor data = cuda_fused::supports_fp8_cast(x) ? cuda_fused::cast_to_fp8(x, s, scalar_type(format))
                                                           : fp8_reference::cast_to_fp8(x, s, scalar_type(format));
  return {data, s.reciprocal(), format, Scaling::tensor};
}

Quantized quantize_rows(const at::Tensor& x, Format format) {
  check_2d(x, "quantize_rows");
  auto [data, inv_scale] = cuda_fused::supports_rowwise_cast_to_fp8(x)
                               ? cuda_fused::rowwise_cast_to_fp8(x, scalar_type(format))
                               : fp8_reference::rowwise_cast_to_fp8(x, scalar_type(format));
  return {data, inv_scale, format, Scaling::row};
}

Quantized quantize_blocks(const at::Tensor& x, MxExponent rule) {
  check_2d(x, "quantize_blocks");
  if (x.size(1) % kMxBlock != 0)
    throw std::invalid_argument("fp8 quantize_blocks: the contracted dim " + std::to_string(x.size(1)) +
                                " is not a multiple of 32");
  auto [data, exponents] = cuda_fused::supports_mx_block_cast_to_fp8(x) ? cuda_fused::mx_block_cast_to_fp8(x, rule)
                                                                       : fp8_reference::mx_block_cast_to_fp8(x, rule);
  return {data, fp8_reference::e8m0_to_float(exponents), Format::e4m3, Scaling::block32};
}

at::Tensor Quantized::dequantize() const {
  const at::Tensor values = data.to(at::kFloat);
  if (scaling != Scaling::block32) return values * inv_scale;
  const int64_t M = values.size(0), K = values.size(1);
  return (values.reshape({M, K / kMxBlock, kMxBlock}) * inv_scale.unsqueeze(2)).reshape({M, K});
}

CastStats cast_stats(const at::Tensor& x, const Quantized& q) {
  at::Tensor scale = q.inv_scale.reciprocal();
  at::Tensor xs;
  const at::Tensor xf = x.to(at::kFloat);
  if (q.scaling == Scaling::block32) {
    const int64_t M = xf.size(0), K = xf.size(1);
    xs = (xf.reshape({M, K / kMxBlock, kMxBlock}) * scale.unsqueeze(2)).reshape({M, K});
  } else {
    xs = xf * scale;
  }
  CastStats s;
  s.numel = x.numel();
  if (s.numel == 0) return s;
  // The element at the amax lands on max_finite up to fp32 rounding of x·(max/amax): not clipped.
  constexpr double kRoundingSlack = 1.0 + 1.0 / (1 << 20);
  s.saturated = (xs.abs() > max_finite(q.format) * kRoundingSlack).sum().item<double>() / double(s.numel);
  s.underflow = ((xf != 0) & (q.data.to(at::kFloat) == 0)).sum().item<double>() / double(s.numel);
  return s;
}

double sqnr_db(const at::Tensor& reference, const at::Tensor& test) {
  const at::Tensor r = reference.to(at::kDouble);
  const double signal = r.norm().item<double>();
  const double noise = (r - test.to(at::kDouble)).norm().item<double>();
  if (noise == 0) return std::numeric_limits<double>::infinity();
  return 20.0 * std::log10(signal / noise);
}

}  // namespace flowtrain::models::fp8
