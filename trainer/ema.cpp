#include "trainer/ema.h"

#include "trainer/checkpoint/state_dict.h"

#include <algorithm>

namespace flowtrain::trainer {

Ema::Ema(const models::DiT& model) : ema_(models::DiT(model->options)) {
  ema_->to(model->pos_embed.device());
  load_state_dict(*ema_, state_dict(*model), "EMA initialisation");
  for (auto& p : ema_->parameters()) p.set_requires_grad(false);
  ema_params_ = ema_->parameters();
}

double Ema::decay_at(double decay, bool warmup, int64_t steps_done) {
  if (!warmup) return decay;
  return std::min(decay, (1.0 + double(steps_done)) / (10.0 + double(steps_done)));
}

void Ema::update(const models::DiT& model, double decay) {
  at::NoGradGuard no_grad;
  const auto params = model->parameters();
  TORCH_CHECK(params.size() == ema_params_.size(), "EMA: model parameter count changed");
  std::vector<at::Tensor> weights;
  weights.reserve(params.size());
  for (const auto& p : params) weights.push_back(p.detach());
  // One multi-tensor kernel on CUDA, the per-tensor lerp_ loop on the CPU.
  at::_foreach_lerp_(ema_params_, weights, 1.0 - decay);
}

}  // namespace flowtrain::trainer
