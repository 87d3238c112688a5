// FP8 training recipes (`fp8.recipe`): for each of a linear's three GEMMs, how each operand is
// cast. y = x·Wᵀ (output), ∂x = ∂y·W (grad_input), ∂W = ∂yᵀ·x (grad_weight); every GEMM is
// written a·bᵀ with both operands contracting their dim 1, so ∂x uses b = Wᵀ and ∂W uses
// a = ∂yᵀ, b = xᵀ. Facts and sources: docs/design/fp8.md.
#pragma once

#include "models/fp8/quantize.h"
#include "models/fp8/recipe_kind.h"

#include <string>
#include <vector>

namespace flowtrain::models::fp8 {


// One operand's cast; fp8 == false keeps it in bf16 (a bf16 GEMM, fp32 accumulation).
struct OperandCast {
  bool fp8 = true;
  Format format = Format::e4m3;
  Scaling scaling = Scaling::tensor;
  MxExponent mx_exponent = MxExponent::floor;  // block32 only
};
struct GemmPlan {
  OperandCast a, b;
  bool fast_accum = false;  // Hopper's faster, less exact fp8 accumulation: the output GEMM only
};
struct RecipePlan {
  GemmPlan output, grad_input, grad_weight;
};
RecipePlan plan(Recipe recipe);  // recipe != none

}  // namespace flowtrain::models::fp8
