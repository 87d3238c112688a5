#include "models/fp8/recipe.h"

#include <stdexcept>

namespace flowtrain::models::fp8 {

namespace {
constexpr Recipe kAll[] = {Recipe::none,    Recipe::tensorwise, Recipe::rowwise,    Recipe::rowwise_gw_hp,
                           Recipe::delayed, Recipe::mxfp8,      Recipe::mxfp8_rceil};
}

const char* name(Recipe recipe) {
  switch (recipe) {
    case Recipe::none: return "none";
    case Recipe::tensorwise: return "tensorwise";
    case Recipe::rowwise: return "rowwise";
    case Recipe::rowwise_gw_hp: return "rowwise_gw_hp";
    case Recipe::delayed: return "delayed";
    case Recipe::mxfp8: return "mxfp8";
    case Recipe::mxfp8_rceil: return "mxfp8_rceil";
  }
  return "?";
}

bool block_scaled(Recipe recipe) { return recipe == Recipe::mxfp8 || recipe == Recipe::mxfp8_rceil; }

std::vector<std::string> recipe_names() {
  std::vector<std::string> names;
  for (Recipe r : kAll) names.emplace_back(name(r));
  return names;
}

Recipe parse_recipe(const std::string& text) {
  for (Recipe r : kAll)
    if (text == name(r)) return r;
  std::string choices;
  for (const auto& n : recipe_names()) choices += (choices.empty() ? "" : " | ") + n;
  throw std::invalid_argument("unknown fp8 recipe '" + text + "' (choices: " + choices + ")");
}

RecipePlan plan(Recipe recipe) {
  const OperandCast e4m3_tensor{true, Format::e4m3, Scaling::tensor};
  const OperandCast e5m2_tensor{true, Format::e5m2, Scaling::tensor};
  const OperandCast e4m3_row{true, Format::e4m3, Scaling::row};
  const OperandCast bf16{false, Format::e4m3, Scaling::tensor};
  switch (recipe) {
    case Recipe::tensorwise:
    case Recipe::delayed:
      // Gradients have a wider dynamic range than values: e5m2 (2 more exponent bits) for ∂y.
      return {{e4m3_tensor, e4m3_tensor, true}, {e5m2_tensor, e4m3_tensor}, {e5m2_tensor, e4m3_tensor}};
    case Recipe::rowwise:
      return {{e4m3_row, e4m3_row, true}, {e4m3_row, e4m3_row}, {e4m3_row, e4m3_row}};
    case Recipe::rowwise_gw_hp:
      return {{e4m3_row, e4m3_row, true}, {e4m3_row, e4m3_row}, {bf16, bf16}};
    case Recipe::mxfp8:
    case Recipe::mxfp8_rceil: {
      const OperandCast block{true, Format::e4m3, Scaling::block32,
                              recipe == Recipe::mxfp8 ? MxExponent::floor : MxExponent::rceil};
      return {{block, block}, {block, block}, {block, block}};
    }
    case Recipe::none: break;
  }
  throw std::invalid_argument("fp8::plan: recipe none has no fp8 GEMMs");
}

}  // namespace flowtrain::models::fp8
