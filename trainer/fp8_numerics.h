// `flowtrain numerics`: what fp8 does to a model, layer by layer, on one real batch — the tool
// for an fp8 run that diverges. The batch runs through the model in fp32 with every chosen
// linear (fp8.include / exclude / min_dim) recording its input x and output gradient ∂y; then,
// for each recipe, each layer's three GEMMs are recomputed in fp8 from exactly those tensors
// (so a layer's figures are its own error, not its predecessors'), and the whole model is run
// again in that recipe for the end-to-end loss and gradient-norm differences.
#pragma once

#include "models/model.h"
#include "trainer/config/config.h"
#include "trainer/first_micro_batch.h"

#include <c10/core/Device.h>

#include <string>
#include <vector>

namespace flowtrain::trainer {

struct LayerNumerics {
  std::string name;
  // 20·log10(‖ref‖ / ‖ref − fp8‖) against float64 from the same x, W, ∂y; NaN when ref is 0.
  double sqnr_out_db = 0, sqnr_grad_input_db = 0, sqnr_grad_weight_db = 0;
  double amax = 0;  // max |x| of the layer's input
  // Over every element the recipe casts to fp8 in the layer's three GEMMs (x, W, ∂y and their
  // re-quantised transposes): the fraction clipped at the format's max, and of non-zero
  // elements flushed to zero.
  double saturated = 0, underflow = 0;
};

struct RecipeNumerics {
  std::string recipe;
  std::vector<LayerNumerics> layers;
  double loss = 0, grad_norm = 0;
  double loss_rel_diff = 0, grad_norm_rel_diff = 0;  // |fp8 − fp32| / |fp32|, whole model
  double grad_cosine = 0;  // cos∠ between the whole model's fp8 and fp32 gradients
};

struct NumericsReport {
  std::string device;
  bool emulated = true;
  double loss = 0, grad_norm = 0;  // fp32
  std::vector<RecipeNumerics> recipes;
  std::string to_json() const;   // {"recipes": {R: {"layers": [...], "loss_rel_diff", "grad_norm_rel_diff"}}, ...}
  std::string to_table() const;  // per recipe: one row per layer, then the whole-model line
};

// `model` is on `device`, in train mode, with fp32 weights; its linears are left as they were
// found (no backend). Holds one fp32 copy of every gradient per pass (for the cosine). Recipes: names (models/fp8/recipe.h), "none" not allowed.
NumericsReport fp8_numerics(const Config& config, models::DiffusionModel& model, const FirstMicroBatch& batch,
                            const std::vector<std::string>& recipes, const c10::Device& device);

}  // namespace flowtrain::trainer
