#include "trainer/ema.h"

#include <algorithm>

namespace flowtrain::trainer {

Ema::Ema(const std::vector<at::Tensor>& weights) {
  at::NoGradGuard no_grad;
  ema_.reserve(weights.size());
  for (const auto& w : weights) ema_.push_back(w.detach().clone().set_requires_grad(false));
}

double Ema::decay_at(double decay, bool warmup, int64_t steps_done) {
  if (!warmup) return decay;
  return std::min(decay, (1.0 + double(steps_done)) / (10.0 + double(steps_done)));
}

void Ema::update(const std::vector<at::Tensor>& weights, double decay) {
  TORCH_CHECK(weights.size() == ema_.size(), "EMA: ", weights.size(), " weights for ", ema_.size(), " averages");
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> w;
  w.reserve(weights.size());
  for (const auto& t : weights) w.push_back(t.detach());
  // One multi-tensor kernel on CUDA, the per-tensor lerp_ loop on the CPU.
  at::_foreach_lerp_(ema_, w, 1.0 - decay);
}

void swap_parameter_data(const std::vector<at::Tensor>& parameters, std::vector<at::Tensor>& other) {
  TORCH_CHECK(parameters.size() == other.size(), "swap_parameter_data: ", parameters.size(), " vs ", other.size());
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters.size(); ++i) {
    at::Tensor current = parameters[i].detach();  // shares the parameter's storage
    const_cast<at::Tensor&>(parameters[i]).set_data(other[i]);
    other[i] = current;
  }
}

}  // namespace flowtrain::trainer
