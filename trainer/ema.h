// Exponential moving average of the weights (ema ← decay·ema + (1 − decay)·w after every
// optimizer step), kept as a second model so sampling and export use it directly.
#pragma once

#include "models/dit/dit.h"

namespace flowtrain::trainer {

class Ema {
 public:
  // Starts as an exact copy of `model` (same options, same weights), on the same device.
  explicit Ema(const models::DiT& model);
  void update(const models::DiT& model, double decay);
  // The decay for the update after `steps_done` optimizer steps. With warm-up the average
  // forgets the random initialisation quickly early on (decay (1+n)/(10+n): 0.1, 0.18, …) and
  // reaches `decay` later; without it a 0.9999 EMA of a short run is mostly the initial weights.
  static double decay_at(double decay, bool warmup, int64_t steps_done);
  models::DiT& model() { return ema_; }

 private:
  models::DiT ema_;
  std::vector<at::Tensor> ema_params_;
};

}  // namespace flowtrain::trainer
