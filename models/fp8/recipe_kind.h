// The fp8 choices a config names (fp8.recipe, fp8.amax_reduce), apart from recipe.h so that the
// config can hold them without including ATen. What each recipe casts: recipe.h.
#pragma once

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

// Delayed scaling: how a layer's amax history becomes the amax of its next scale.
enum class AmaxReduce {
  max,          // the largest amax in the history (Transformer Engine's default)
  most_recent,  // the newest entry
};

}  // namespace flowtrain::models::fp8
