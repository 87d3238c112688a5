#include "trainer/health/block_telemetry.h"

#include <algorithm>
#include <cctype>
#include <cmath>

namespace flowtrain::trainer {

std::string block_of(const std::string& name) {
  // "<list>.<index>.…" is one block of a list (blocks, double_blocks, single_blocks); anything
  // else belongs to its top-level module (x_embedder, t_embedder.mlp.0 → t_embedder, …).
  const size_t first = name.find('.');
  if (first == std::string::npos) return name;
  const size_t second = name.find('.', first + 1);
  const std::string index = name.substr(first + 1, second == std::string::npos ? std::string::npos : second - first - 1);
  const bool digits = !index.empty() && std::all_of(index.begin(), index.end(), [](unsigned char c) { return std::isdigit(c); });
  return digits ? name.substr(0, second) : name.substr(0, first);
}

std::map<std::string, double> block_sq_norms(const std::vector<std::pair<std::string, double>>& per_parameter) {
  std::map<std::string, double> out;
  for (const auto& [name, sq] : per_parameter) out[block_of(name)] += sq;
  return out;
}

void BlockTelemetry::before_update(TrainState& state) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> weights = state.trainable_tensors();
  std::vector<at::Tensor> grads;
  before_.clear();
  for (const at::Tensor& w : weights) {
    grads.push_back(w.grad());
    before_.push_back(w.detach().clone());
  }
  grad_sq_ = block_sq_norms(state.parameter_sq_norms(grads));
}

std::map<std::string, double> BlockTelemetry::after_update(TrainState& state) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> weights = state.trainable_tensors();
  std::vector<at::Tensor> deltas;
  for (size_t i = 0; i < weights.size(); ++i) deltas.push_back(weights[i].detach() - before_[i]);
  const auto update_sq = block_sq_norms(state.parameter_sq_norms(deltas));
  const auto weight_sq = block_sq_norms(state.parameter_sq_norms(before_));
  before_.clear();
  std::map<std::string, double> values;
  for (const auto& [block, g] : grad_sq_) values["grad_norm/" + block] = std::sqrt(g);
  for (const auto& [block, u] : update_sq) {
    // A block whose weights are all zero (zero-initialised adaLN before its first update) has no
    // ratio; it is left out rather than written as 0 or infinity.
    const double w = weight_sq.count(block) ? weight_sq.at(block) : 0.0;
    if (w > 0) values["update_ratio/" + block] = std::sqrt(u / w);
  }
  return values;
}

}  // namespace flowtrain::trainer
