#include "models/fp8/convert.h"

#include <fnmatch.h>

#include <algorithm>
#include <map>
#include <regex>
#include <stdexcept>

namespace flowtrain::models::fp8 {

bool glob_match(const std::string& pattern, const std::string& name) {
  return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;  // no FNM_PATHNAME: '*' crosses dots
}

namespace {
bool matches_any(const std::vector<std::string>& patterns, const std::string& name) {
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& p) { return glob_match(p, name); });
}
}  // namespace

Fp8Conversion convert_linears(torch::nn::Module& model, const Fp8Options& options) {
  Fp8Conversion out;
  if (options.recipe == Recipe::none) return out;
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    auto* linear = item.value()->as<Linear>();
    if (linear == nullptr) continue;
    const std::string& name = item.key();
    if (!matches_any(options.include, name) || matches_any(options.exclude, name)) continue;
    const int64_t in = linear->in_features, out_features = linear->out_features;
    if (std::min(in, out_features) < options.min_dim) {
      out.skipped.push_back(name + " (" + std::to_string(in) + "->" + std::to_string(out_features) +
                            " below fp8.min_dim " + std::to_string(options.min_dim) + ")");
      continue;
    }
    if (options.require_multiple_of_16 && (in % 16 != 0 || out_features % 16 != 0)) {
      out.skipped.push_back(name + " (" + std::to_string(in) + "->" + std::to_string(out_features) +
                            ": the fp8 GEMM needs multiples of 16)");
      continue;
    }
    auto compute = std::make_shared<Fp8Linear>(options.recipe, options.emulate, options.delayed);
    linear->set_compute(compute);
    out.layers.push_back(compute);
    out.converted.push_back(name);
  }
  return out;
}

std::string Fp8Conversion::summary(const Fp8Options& options) const {
  // Block indices folded: "blocks.*.attn.qkv ×12" instead of twelve names.
  std::map<std::string, int64_t> counts;
  std::vector<std::string> order;
  static const std::regex index(R"(\.\d+\.)");
  for (const auto& name : converted) {
    const std::string key = std::regex_replace(name, index, ".*.");
    if (counts[key]++ == 0) order.push_back(key);
  }
  std::string text = std::string("fp8 ") + name(options.recipe) + (options.emulate ? " (emulated)" : "") + ": " +
                     std::to_string(converted.size()) + " linears converted";
  std::string names;
  for (const auto& key : order)
    names += (names.empty() ? "" : ", ") + key + (counts[key] > 1 ? " x" + std::to_string(counts[key]) : "");
  if (!names.empty()) text += " [" + names + "]";
  if (!skipped.empty()) text += "; " + std::to_string(skipped.size()) + " kept in high precision (first: " + skipped.front() + ")";
  return text;
}

void commit_amax_histories(const Fp8Conversion& conversion, const std::function<void(at::Tensor&)>& reduce_max) {
  std::vector<Fp8Linear*> delayed;
  std::vector<at::Tensor> pending;
  for (const auto& layer : conversion.layers) {
    // A layer that never ran has no state yet (it allocates on its first call); skipping it
    // keeps the stacked tensor the same on every rank, since all ranks run the same layers.
    if (layer->recipe() != Recipe::delayed || !layer->pending_amax().defined()) continue;
    delayed.push_back(layer.get());
    pending.push_back(layer->pending_amax());
  }
  if (delayed.empty()) return;
  at::Tensor all = at::stack(pending);  // [layers, 3]
  if (reduce_max) reduce_max(all);
  for (size_t i = 0; i < delayed.size(); ++i) delayed[i]->commit_amax(all[static_cast<int64_t>(i)]);
}

void discard_pending_amaxes(const Fp8Conversion& conversion) {
  for (const auto& layer : conversion.layers)
    if (layer->recipe() == Recipe::delayed && layer->pending_amax().defined()) layer->pending_amax().zero_();
}

NamedTensors amax_history_state(const Fp8Conversion& conversion) {
  NamedTensors state;
  for (size_t i = 0; i < conversion.layers.size(); ++i) {
    const Fp8Linear& layer = *conversion.layers[i];
    if (layer.recipe() != Recipe::delayed || layer.amax_commits() == 0) continue;
    const std::string& name = conversion.converted[i];
    state.emplace_back(name + ".amax_history", layer.amax_history().detach());
    state.emplace_back(name + ".amax_commits", at::scalar_tensor(layer.amax_commits(), at::kLong));
  }
  return state;
}

int64_t restore_amax_histories(const Fp8Conversion& conversion, const NamedTensors& state) {
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  int64_t restored = 0;
  for (size_t i = 0; i < conversion.layers.size(); ++i) {
    Fp8Linear& layer = *conversion.layers[i];
    const std::string& name = conversion.converted[i];
    if (layer.recipe() != Recipe::delayed) continue;
    layer.restore_amax_history(at::zeros({0, 3}), 0);  // afresh, unless the state names it
    const auto history = by_name.find(name + ".amax_history");
    const auto commits = by_name.find(name + ".amax_commits");
    if (history == by_name.end()) continue;
    if (commits == by_name.end() || commits->second.numel() != 1)
      throw std::invalid_argument("fp8 state: " + name + ".amax_history without a scalar " + name + ".amax_commits");
    try {
      layer.restore_amax_history(history->second.to(at::kFloat), commits->second.item<int64_t>());
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("fp8 state: " + name + ": " + e.what());
    }
    ++restored;
  }
  return restored;
}

}  // namespace flowtrain::models::fp8
