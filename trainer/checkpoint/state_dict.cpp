#include "trainer/checkpoint/state_dict.h"

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

}  // namespace flowtrain::trainer
