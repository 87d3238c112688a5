// Exponential moving average of the weights (ema ← decay·ema + (1 − decay)·w after every
// optimizer step), kept as a second model so sampling and export use it directly.
#pragma once

#include "models/dit.h"

namespace flowtrain::trainer {

class Ema {
 public:
  // Starts as an exact copy of `model` (same options, same weights), on the same device.
  explicit Ema(const models::DiT& model);
  void update(const models::DiT& model, double decay);
  models::DiT& model() { return ema_; }

 private:
  models::DiT ema_;
  std::vector<at::Tensor> ema_params_, params_cache_;
};

}  // namespace flowtrain::trainer
