// FP8 training recipes (`fp8.recipe`): for each of a linear's three GEMMs, how each operand is
// cast. y = x·Wᵀ (output), ∂x = ∂y·W (grad_input), ∂W = ∂yᵀ·x (grad_weight); every GEMM is
// written a·bᵀ with both operands contracting their dim 1, so ∂x uses b = Wᵀ and ∂W uses
// a = ∂yᵀ, b = xᵀ. Facts and sources: docs/design/fp8.md.
#pragma once

#include "models/fp8/quantize.h"

#include <string>
#include <vector>

namespace flowtrain::models::fp8 {

enum class Recipe {
  none,           // no fp8 (the linear keeps at::linear)
  tensorwise,     // dynamic per-tensor scales; x, W e4m3, ∂y e5m2; backward reuses x's and W's scales
  rowwise,        // per-row power-of-two scales, all e4m3; backward re-quantises along the other axis
  rowwise_gw_hp,  // rowwise, with the weight-gradient GEMM in bf16
  delayed,        // tensorwise with scales from an amax history (Transformer Engine's default)
  mxfp8,          // 1×32 blocks with e8m0 scales, all e4m3 (Blackwell's MX format; emulated here)
  mxfp8_rceil,    // mxfp8 with each block's scale rounded up (NVIDIA's rule): no element saturates
};
Recipe parse_recipe(const std::string& text);  // throws std::invalid_argument listing the choices
const char* name(Recipe recipe);
bool block_scaled(Recipe recipe);  // an MX recipe: its GEMMs need Blackwell's block-scaled fp8
std::vector<std::string> recipe_names();

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
