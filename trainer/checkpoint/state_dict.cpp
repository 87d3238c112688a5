#include "trainer/checkpoint/state_dict.h"

#include "data/weight_files.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <set>

namespace flowtrain::trainer {

NamedTensors state_dict(const torch::nn::Module& module) {
  NamedTensors out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) out.emplace_back(item.key(), item.value().detach());
  for (const auto& item : module.named_buffers(/*recurse=*/true)) out.emplace_back(item.key(), item.value().detach());
  return out;
}

void load_state_dict(torch::nn::Module& module, const NamedTensors& tensors, const std::string& source) {
  std::map<std::string, const at::Tensor*> given;
  for (const auto& [name, t] : tensors) given[name] = &t;
  std::set<std::string> used;
  at::NoGradGuard no_grad;
  for (auto& [name, target] : state_dict(module)) {
    auto it = given.find(name);
    if (it == given.end()) throw CheckpointError(fmt::format("{}: missing tensor '{}'", source, name));
    const at::Tensor& src = *it->second;
    if (src.sizes() != target.sizes())
      throw CheckpointError(fmt::format("{}: tensor '{}' has shape [{}], the model expects [{}]", source, name,
                                        fmt::join(src.sizes(), ", "), fmt::join(target.sizes(), ", ")));
    target.copy_(src);
    used.insert(name);
  }
  for (const auto& [name, t] : given) {
    if (!used.count(name))
      throw CheckpointError(fmt::format("{}: unexpected tensor '{}' (not in this model; wrong model config?)", source, name));
  }
}

void load_weights_file(torch::nn::Module& module, const std::string& path, const std::string& prefix,
                       const std::map<std::string, std::string>& tied) {
  const data::WeightFiles file = [&] {
    try {
      return data::WeightFiles(path);
    } catch (const data::DataError& e) {
      throw CheckpointError(e.what());
    }
  }();
  std::set<std::string> in_file(file.keys().begin(), file.keys().end()), matched;
  // A tied copy stands in for its tensor when the file lacks the tensor, and is ignored when it
  // has both (the same values saved twice).
  std::map<std::string, std::string> read_from;  // model key -> file key
  for (const auto& [copy, tensor] : tied) {
    if (!in_file.count(copy)) continue;
    matched.insert(copy);
    if (!in_file.count(tensor)) {
      in_file.insert(tensor);
      read_from[tensor] = copy;
    }
  }
  auto file_key = [&](const std::string& key) {
    const auto it = read_from.find(key);
    return it == read_from.end() ? key : it->second;
  };
  std::vector<std::string> missing, misshaped, unexpected;
  std::vector<std::pair<std::string, at::Tensor>> targets;
  for (auto& [name, target] : state_dict(module)) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string key = name.substr(prefix.size());
    if (!in_file.count(key)) {
      missing.push_back(key);
      continue;
    }
    matched.insert(key);
    const std::vector<int64_t> shape = file.shape(file_key(key));
    if (target.sizes() != at::IntArrayRef(shape))
      misshaped.push_back(fmt::format("{} (file [{}], model [{}])", key, fmt::join(shape, ", "),
                                      fmt::join(target.sizes(), ", ")));
    else
      targets.emplace_back(key, target);
  }
  for (const auto& key : file.keys())
    if (!matched.count(key)) unexpected.push_back(key);
  if (!missing.empty() || !misshaped.empty() || !unexpected.empty()) {
    auto list = [](const std::vector<std::string>& keys) {
      constexpr size_t kShown = 8;
      std::vector<std::string> shown(keys.begin(), keys.begin() + std::min(kShown, keys.size()));
      return fmt::format("{}{}", fmt::join(shown, ", "),
                         keys.size() > kShown ? fmt::format(" … ({} in all)", keys.size()) : std::string());
    };
    std::string message = fmt::format("{}: does not fit the model{}", path,
                                      prefix.empty() ? std::string() : fmt::format(" (its '{}' part)", prefix));
    if (!missing.empty()) message += fmt::format("; missing keys: {}", list(missing));
    if (!misshaped.empty()) message += fmt::format("; keys of another shape: {}", list(misshaped));
    if (!unexpected.empty()) message += fmt::format("; unexpected keys: {}", list(unexpected));
    throw CheckpointError(message + " (another architecture or size?)");
  }
  at::NoGradGuard no_grad;
  for (auto& [key, target] : targets) target.copy_(file.get(file_key(key)));
}

}  // namespace flowtrain::trainer
