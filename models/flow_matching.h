// Flow matching (rectified flow), in the Flux / SD3 convention:
//   t = 0 is data, t = 1 is noise;  x_t = (1 − t)·x0 + t·ε;  the model predicts v = ε − x0;
//   sampling integrates dx/dt = v from t = 1 (pure noise) down to t = 0.
// (SiT uses the reverse time: t_SiT = 1 − t, v_SiT = −v.)
//
// Every random draw takes an explicit generator, so a caller seeding it from (seed, rank, step)
// gets the same timesteps, noise and conditioning dropout after a resume. Conditioning travels
// as a named bundle (models/conditioning.h): nothing here knows a modality.
#pragma once

#include "models/conditioning.h"
#include "models/flow_kinds.h"
#include "models/model.h"

#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <string>

namespace flowtrain::models {


struct TimestepSampler {
  TimestepDistribution distribution = TimestepDistribution::LogitNormal;
  double logit_mean = 0.0;  // u ~ N(mean, std), t = sigmoid(u)   (SD3's best: 0, 1)
  double logit_std = 1.0;
  double shift = 1.0;       // resolution shift α: t' = α·t / (1 + (α − 1)·t)

  at::Tensor sample(int64_t n, at::Generator& gen, const at::TensorOptions& options) const;  // [n] float
};

// The resolution shift, applied to training and sampling times alike. α = 1 is the identity.
at::Tensor shift_time(const at::Tensor& t, double alpha);

// x_t = (1 − t)·x0 + t·ε, with t [B] broadcast over the remaining dims.
at::Tensor interpolate(const at::Tensor& x0, const at::Tensor& noise, const at::Tensor& t);

// A velocity model v(x, t, cond): x [B, ...], t [B] in [0, 1] -> the shape of x (or more channels).
using VelocityFn = std::function<at::Tensor(const at::Tensor& x, const at::Tensor& t, const Conditioning& cond)>;

// The random inputs of one objective evaluation, drawn in a fixed order (t, noise, one uniform
// per conditioning-dropout entry) so a generator seeded the same way always gives the same draw.
struct FlowMatchingDraw {
  at::Tensor t;       // [B] float
  at::Tensor noise;   // like x0
  Conditioning cond;  // after classifier-free-guidance dropout
};
// All rows from one generator, drawn on the generator's device (a CPU generator gives the same
// draws whatever device the model trains on).
FlowMatchingDraw draw_flow_matching_inputs(const at::Tensor& x0, const Conditioning& cond,
                                           const TimestepSampler& timesteps, const ConditioningDropout& dropout,
                                           at::Generator& gen);

// The draws for rows [first_row, first_row + B) of a global batch, each row from its own CPU
// generator seeded with row_seed(global row index), in the same order. A row's draw does not
// depend on how the global batch is split across data-parallel ranks and micro-batches, so every
// layout of the same global batch trains on the same noise.
FlowMatchingDraw draw_flow_matching_inputs_per_row(const at::Tensor& x0, const Conditioning& cond,
                                                   const TimestepSampler& timesteps,
                                                   const ConditioningDropout& dropout,
                                                   const std::function<uint64_t(int64_t)>& row_seed,
                                                   int64_t first_row);

struct FlowMatchingLoss {
  at::Tensor loss;       // scalar, mean over all elements: mean((v_pred − (ε − x0))²)
  at::Tensor t;          // [B] the sampled times (for logging per-t loss later)
  at::Tensor prediction, target;  // detached v (first C channels) and ε − x0, for per-sample views
};

// [B]: each sample's mean squared error of a loss's prediction (equal-size samples: their mean is
// the loss). The health check's per-sample view of a spiking batch.
at::Tensor per_sample_loss(const FlowMatchingLoss& l);

// mean((v(x_t, t, cond) − (ε − x0))²) for a given draw. A model with more output channels than
// x0 (learn-sigma) is trained on its first C channels only.
FlowMatchingLoss flow_matching_loss(const VelocityFn& model, const at::Tensor& x0, const FlowMatchingDraw& draw);


struct SamplerOptions {
  SamplerKind kind = SamplerKind::Euler;
  int64_t steps = 50;
  double cfg_scale = 1.0;   // w: v = v_u + w·(v_c − v_u); 1 = plain conditional
  double shift = 1.0;       // same α as training
};

// The time grid 1 = t_0 > t_1 > … > t_N = 0: linspace(1, 0, N + 1), then shifted.
at::Tensor sampling_times(int64_t steps, double shift);

// Integrates from noise (t = 1) to data (t = 0). Euler: x += (t_next − t)·v. Heun: the
// trapezoidal corrector on every step but the last (which is Euler, as t_next = 0 there).
// With classifier-free guidance (cfg_scale != 1) the conditional batch (`cond`) and the
// unconditional one (`null_cond`, the model's null_conditioning) run as one.
at::Tensor sample(const VelocityFn& model, const at::Tensor& noise, const Conditioning& cond,
                  const Conditioning& null_cond, const SamplerOptions& options);

}  // namespace flowtrain::models
