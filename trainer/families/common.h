// Rules every patch-token transformer family applies to its model section.
#pragma once

#include "trainer/config/config.h"
#include "trainer/family.h"

#include <functional>
#include <string>
#include <vector>

namespace flowtrain::trainer::families {

// model.hidden divisible by model.heads, model.image_size by model.patch, and a patch's values
// (patch_t · patch² · in_channels, patch_t the frames one token spans) no more than
// model.hidden. Throws ConfigError naming the keys.
void check_patch_transformer(const ModelConfig& model, int64_t patch_t = 1);

// A comma-separated list of positive integers ("16,56,56"), each also satisfying `also` when
// given; otherwise ConfigError "'model.KEY' must be comma-separated positive <what> integers
// (e.g. EXAMPLE), got 'TEXT'".
std::vector<int64_t> parse_positive_ints(const std::string& text, const std::string& key, const std::string& example,
                                         const std::string& what = "", const std::function<bool(int64_t)>& also = {});

// A family's preset of `size` from its options-by-name function (which throws
// std::invalid_argument for a foreign name), as the ConfigError "'model.size' 'X' is not a
// <family> size (one of …)".
ModelPreset preset_from(const std::string& size, const std::string& family_name,
                        const std::function<ModelPreset(const std::string&)>& by_name,
                        const std::vector<std::string>& names);

// The same from a family's options-by-name function whose result has hidden, depth and heads.
template <class OptionsOfSize>
ModelPreset preset_from_options(const std::string& size, const std::string& family_name, OptionsOfSize options_of,
                                const std::vector<std::string>& names) {
  return preset_from(
      size, family_name,
      [&](const std::string& name) {
        const auto o = options_of(name);
        return ModelPreset{o.hidden, o.depth, o.heads};
      },
      names);
}

}  // namespace flowtrain::trainer::families
