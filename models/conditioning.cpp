#include "models/conditioning.h"

#include <fmt/format.h>

#include <stdexcept>

namespace flowtrain::models {

Conditioning::Conditioning(std::initializer_list<std::pair<const std::string, at::Tensor>> items) {
  for (const auto& [name, tensor] : items) set(name, tensor);
}

void Conditioning::set(const std::string& name, at::Tensor tensor) {
  if (!tensor.defined() || tensor.dim() < 1)
    throw std::invalid_argument(fmt::format("conditioning '{}' must be a tensor with the batch on dim 0", name));
  if (!tensors_.empty() && !has(name) && tensor.size(0) != batch())
    throw std::invalid_argument(
        fmt::format("conditioning '{}' has {} rows, the others {}", name, tensor.size(0), batch()));
  tensors_[name] = std::move(tensor);
}

const at::Tensor& Conditioning::at(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    std::string present;
    for (const auto& [n, t] : tensors_) present += (present.empty() ? "" : ", ") + n;
    throw std::invalid_argument(fmt::format("the model needs conditioning '{}'; the batch has [{}]", name, present));
  }
  return it->second;
}

int64_t Conditioning::batch() const { return tensors_.empty() ? 0 : tensors_.begin()->second.size(0); }

Conditioning Conditioning::rows(int64_t first, int64_t count) const {
  Conditioning out;
  for (const auto& [name, t] : tensors_) out.tensors_[name] = t.narrow(0, first, count);
  return out;
}

Conditioning Conditioning::index_select(const at::Tensor& index) const {
  Conditioning out;
  for (const auto& [name, t] : tensors_) out.tensors_[name] = t.index_select(0, index.to(t.device()));
  return out;
}

Conditioning Conditioning::to(const c10::Device& device, bool non_blocking) const {
  Conditioning out;
  for (const auto& [name, t] : tensors_) out.tensors_[name] = t.to(device, non_blocking);
  return out;
}

Conditioning Conditioning::cat(const Conditioning& a, const Conditioning& b) {
  Conditioning out;
  for (const auto& [name, t] : a.tensors_) out.tensors_[name] = at::cat({t, b.at(name)});
  return out;
}

}  // namespace flowtrain::models
