// The fp8 GEMM a·bᵀ of a recipe's plan: on a CUDA device of compute capability ≥ 8.9 through
// at::_scaled_mm (cuBLASLt fp8 tensor cores), elsewhere — and whenever `emulate` is set —
// emulated: each operand quantised with the same scales and saturation, dequantised, and
// multiplied in fp32. The emulation computes the same function up to accumulation order, which
// is what the CPU tests and quality runs rely on.
#pragma once

#include "models/fp8/quantize.h"
#include "models/fp8/recipe.h"

#include <ATen/ATen.h>

namespace flowtrain::models::fp8 {

// One operand [rows, K] (K contracted) and how it is cast. `scale` is the tensor-scaling scale to
// use (delayed scaling, or a scale shared with the forward); undefined = from this operand's amax.
struct GemmOperand {
  at::Tensor value;
  OperandCast cast;
  at::Tensor scale{};
  // Set when the operand arrives already cast (FSDP's fp8 all-gather; tensor scaling only): used
  // as is, and `value` is read for its device only.
  Quantized cast_value{};
};

// The operand as the GEMM sees it (fp8 data + inverse scales); cast.fp8 must be true.
Quantized quantize(const at::Tensor& value, const OperandCast& cast, const at::Tensor& scale = {});

// a [M, K] · b [N, K]ᵀ -> [M, N] in `out_dtype`. K need not be a multiple of 16 or 32: both
// operands are zero-padded along K (which leaves the product unchanged).
at::Tensor scaled_gemm(const GemmOperand& a, const GemmOperand& b, bool fast_accum, bool emulate,
                       at::ScalarType out_dtype);

// True when at::_scaled_mm runs the pair on `device` (CUDA; both fp8; tensor or row scaling).
bool runs_in_hardware(const OperandCast& a, const OperandCast& b, const c10::Device& device, bool emulate);

}  // namespace flowtrain::models::fp8
