#include "models/fp8/scaled_gemm.h"

#include <stdexcept>

namespace flowtrain::models::fp8 {

namespace {
// cuBLASLt's fp8 GEMM needs the contracted dim to be a multiple of 16; MX blocks span 32.
constexpr int64_t kHardwareK = 16;

// What a bf16 GEMM sees of an operand kept in high precision: its bf16 rounding.
at::Tensor bf16_rounded(const at::Tensor& x) { return x.to(at::kBFloat16).to(at::kFloat); }
}  // namespace

namespace {
// The fp8 operand as the GEMM consumes it, K padded to `multiple` (zero bytes are +0 in both
// formats; a tensor scale does not depend on K).
Quantized fp8_operand(const GemmOperand& o, int64_t multiple) {
  if (!o.cast_value.data.defined()) return quantize(pad_contracted(o.value, multiple), o.cast, o.scale);
  TORCH_CHECK(o.cast_value.scaling == Scaling::tensor, "scaled_gemm: a precast operand must be tensor-scaled");
  Quantized q = o.cast_value;
  q.data = pad_contracted(q.data.view(at::kByte), multiple).view(q.data.scalar_type());
  return q;
}
}  // namespace

Quantized quantize(const at::Tensor& value, const OperandCast& cast, const at::Tensor& scale) {
  if (!cast.fp8) throw std::invalid_argument("fp8::quantize: the operand is kept in bf16");
  switch (cast.scaling) {
    case Scaling::tensor:
      return quantize_tensor(value, cast.format, scale.defined() ? scale : tensor_scale(abs_max(value), cast.format));
    case Scaling::row: return quantize_rows(value, cast.format);
    case Scaling::block32: return quantize_blocks(value, cast.mx_exponent);
  }
  throw std::invalid_argument("fp8::quantize: unknown scaling");
}

bool runs_in_hardware(const OperandCast& a, const OperandCast& b, const c10::Device& device, bool emulate) {
  return !emulate && device.is_cuda() && a.fp8 && b.fp8 && a.scaling != Scaling::block32 &&
         b.scaling != Scaling::block32 && a.scaling == b.scaling;
}

at::Tensor scaled_gemm(const GemmOperand& a, const GemmOperand& b, bool fast_accum, bool emulate,
                       at::ScalarType out_dtype) {
  const bool blocks = (a.cast.fp8 && a.cast.scaling == Scaling::block32) || (b.cast.fp8 && b.cast.scaling == Scaling::block32);
  const bool hardware = runs_in_hardware(a.cast, b.cast, a.value.device(), emulate);
  const int64_t multiple = blocks ? kMxBlock : hardware ? kHardwareK : 1;
  if (hardware) {
    const Quantized qa = fp8_operand(a, multiple), qb = fp8_operand(b, multiple);
    // Row scaling: scale_a [M, 1], scale_b [1, N], bf16 output only; tensor scaling: 0-dim scales.
    const bool rows = a.cast.scaling == Scaling::row;
    const at::ScalarType mm_dtype = rows || out_dtype == at::kBFloat16 ? at::kBFloat16 : at::kFloat;
    const at::Tensor scale_b = rows ? qb.inv_scale.t().contiguous() : qb.inv_scale;
    // a row-major [M, K]; b column-major [K, N], i.e. the transpose of a contiguous [N, K].
    return at::_scaled_mm(qa.data.contiguous(), qb.data.contiguous().t(), qa.inv_scale, scale_b,
                          /*bias=*/std::nullopt, /*scale_result=*/std::nullopt, mm_dtype, fast_accum)
        .to(out_dtype);
  }
  if (!a.cast.fp8 && !b.cast.fp8 && a.value.is_cuda() && !emulate)  // a bf16 GEMM on the tensor cores
    return at::matmul(pad_contracted(a.value, multiple).to(at::kBFloat16),
                      pad_contracted(b.value, multiple).to(at::kBFloat16).t())
        .to(out_dtype);

  const at::Tensor ad = a.cast.fp8 ? fp8_operand(a, multiple).dequantize() : bf16_rounded(pad_contracted(a.value, multiple));
  const at::Tensor bd = b.cast.fp8 ? fp8_operand(b, multiple).dequantize() : bf16_rounded(pad_contracted(b.value, multiple));
  const at::Tensor product = at::matmul(ad, bd.t());
  // Rounded where the hardware path rounds, so the emulation is the same function: row-scaled
  // fp8 GEMMs and bf16 GEMMs give bf16 there (a 2^-9 relative step, far below fp8's 2^-4).
  const bool rows = a.cast.fp8 && a.cast.scaling == Scaling::row;
  const bool bf16_gemm = !a.cast.fp8 && !b.cast.fp8;
  return (rows || bf16_gemm ? product.to(at::kBFloat16) : product).to(out_dtype);
}

}  // namespace flowtrain::models::fp8
