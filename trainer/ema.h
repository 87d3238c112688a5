// Exponential moving average of the weights: ema ← decay·ema + (1 − decay)·w after every
// optimizer step. One rule for both train states: the tensors are the model's parameters in a
// single process, this rank's FSDP shards under sharding.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace flowtrain::trainer {

class Ema {
 public:
  // Starts as an exact copy of `weights` (same shapes, devices), not requiring grad.
  explicit Ema(const std::vector<at::Tensor>& weights);
  void update(const std::vector<at::Tensor>& weights, double decay);
  // The decay for the update after `steps_done` optimizer steps. With warm-up the average
  // forgets the random initialisation quickly early on (decay (1+n)/(10+n): 0.1, 0.18, …) and
  // reaches `decay` later; without it a 0.9999 EMA of a short run is mostly the initial weights.
  static double decay_at(double decay, bool warmup, int64_t steps_done);
  std::vector<at::Tensor>& tensors() { return ema_; }
  const std::vector<at::Tensor>& tensors() const { return ema_; }

 private:
  std::vector<at::Tensor> ema_;
};

// Exchanges the data of each parameter with the matching tensor of `other` (same shape and
// dtype): the model then computes with `other`'s values. Calling it twice restores both. For
// sampling with the EMA weights without a second copy of the model.
void swap_parameter_data(const std::vector<at::Tensor>& parameters, std::vector<at::Tensor>& other);

}  // namespace flowtrain::trainer
