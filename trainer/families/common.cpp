#include "trainer/families/common.h"

#include <fmt/format.h>

#include <sstream>
#include <stdexcept>

namespace flowtrain::trainer::families {

std::vector<int64_t> parse_positive_ints(const std::string& text, const std::string& key, const std::string& example,
                                         const std::string& what, const std::function<bool(int64_t)>& also) {
  const std::string error = fmt::format("'model.{}' must be comma-separated positive {}integers (e.g. {}), got '{}'", key,
                                        what.empty() ? "" : what + " ", example, text);
  std::vector<int64_t> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      throw ConfigError(error);
    }
    if (used != item.size() || v <= 0 || (also && !also(v))) throw ConfigError(error);
    values.push_back(v);
  }
  if (values.empty()) throw ConfigError(error);
  return values;
}

void check_patch_transformer(const ModelConfig& model, int64_t patch_t) {
  const int64_t hidden = model.resolved_hidden();
  const int64_t heads = model.resolved_heads();
  auto hidden_text = "'model.hidden' (" + std::to_string(hidden) + (model.hidden > 0 ? "" : ", from model.size") + ")";
  if (hidden % heads != 0)
    throw ConfigError(hidden_text + " must be divisible by 'model.heads' (" + std::to_string(heads) +
                      (model.heads > 0 ? "" : ", from model.size") + ")");
  if (model.image_size % model.patch != 0)
    throw ConfigError("'model.image_size' (" + std::to_string(model.image_size) + ") must be divisible by 'model.patch' (" +
                      std::to_string(model.patch) + ")");
  // The patch embedding maps patch² × channels values to the hidden width. Narrower, it has a
  // null space: the noise there is never seen, so never removed, and stays in every sample (a
  // 147 → 128 map on 7×7 RGB patches left 19/147 of the noise: speckle over every canvas).
  const int64_t patch_values = patch_t * model.patch * model.patch * model.in_channels;
  if (patch_values > hidden)
    throw ConfigError(fmt::format("{} is narrower than a patch's {} values ('model.patch' {}² × 'model.in_channels' {}): "
                                  "the model could never remove the noise in the other {} dimensions; use a wider "
                                  "model.hidden or a smaller model.patch{}",
                                  hidden_text, patch_values, model.patch, model.in_channels, patch_values - hidden,
                                  patch_t > 1 ? fmt::format(" (values also × 'model.patch_t' {})", patch_t) : ""));
}

ModelPreset preset_from(const std::string& size, const std::string& family_name,
                        const std::function<ModelPreset(const std::string&)>& by_name,
                        const std::vector<std::string>& names) {
  try {
    return by_name(size);
  } catch (const std::invalid_argument&) {
    throw ConfigError(fmt::format("'model.size' '{}' is not a {} size (one of {})", size, family_name,
                                  fmt::join(names, "|")));
  }
}

}  // namespace flowtrain::trainer::families
