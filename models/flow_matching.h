// Flow matching (rectified flow), in the Flux / SD3 convention:
//   t = 0 is data, t = 1 is noise;  x_t = (1 − t)·x0 + t·ε;  the model predicts v = ε − x0;
//   sampling integrates dx/dt = v from t = 1 (pure noise) down to t = 0.
// (SiT uses the reverse time: t_SiT = 1 − t, v_SiT = −v.)
//
// Every random draw takes an explicit generator, so a caller seeding it from (seed, rank, step)
// gets the same timesteps, noise and label dropout after a resume.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <string>

namespace flowtrain::models {

enum class TimestepDistribution { Uniform, LogitNormal };
TimestepDistribution parse_timestep_distribution(const std::string& name);  // uniform | logit_normal

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

// Replaces each label by `null_class` with probability p (classifier-free guidance training).
at::Tensor drop_labels(const at::Tensor& labels, double p, int64_t null_class, at::Generator& gen);

// A velocity model v(x, t, y): x [B, ...], t [B] in [0, 1], y [B] -> same shape as x.
using VelocityFn = std::function<at::Tensor(const at::Tensor& x, const at::Tensor& t, const at::Tensor& y)>;

// The random inputs of one objective evaluation, drawn in a fixed order (t, noise, label
// dropout) so a generator seeded the same way always gives the same draw.
struct FlowMatchingDraw {
  at::Tensor t;       // [B] float
  at::Tensor noise;   // like x0
  at::Tensor labels;  // [B] after dropout to the null class
};
FlowMatchingDraw draw_flow_matching_inputs(const at::Tensor& x0, const at::Tensor& labels,
                                           const TimestepSampler& timesteps, double label_dropout,
                                           int64_t null_class, at::Generator& gen);

// The draws for rows [first_row, first_row + B) of a global batch, each row from its own CPU
// generator seeded with row_seed(global row index), in the same order (t, noise, dropout). A
// row's draw does not depend on how the global batch is split across data-parallel ranks and
// micro-batches, so every layout of the same global batch trains on the same noise.
FlowMatchingDraw draw_flow_matching_inputs_per_row(const at::Tensor& x0, const at::Tensor& labels,
                                                   const TimestepSampler& timesteps, double label_dropout,
                                                   int64_t null_class, const std::function<uint64_t(int64_t)>& row_seed,
                                                   int64_t first_row);

struct FlowMatchingLoss {
  at::Tensor loss;       // scalar, mean over all elements: mean((v_pred − (ε − x0))²)
  at::Tensor t;          // [B] the sampled times (for logging per-t loss later)
};

// mean((v(x_t, t, y) − (ε − x0))²) for a given draw. A learn-sigma model (2·C outputs) is
// trained on its first C channels only.
FlowMatchingLoss flow_matching_loss(const VelocityFn& model, const at::Tensor& x0, const FlowMatchingDraw& draw);

// One training objective evaluation: draw, then loss.
FlowMatchingLoss flow_matching_loss(const VelocityFn& model, const at::Tensor& x0, const at::Tensor& labels,
                                    const TimestepSampler& timesteps, double label_dropout,
                                    int64_t null_class, at::Generator& gen);

enum class SamplerKind { Euler, Heun };
SamplerKind parse_sampler(const std::string& name);  // euler | heun

struct SamplerOptions {
  SamplerKind kind = SamplerKind::Euler;
  int64_t steps = 50;
  double cfg_scale = 1.0;   // w: v = v_u + w·(v_c − v_u); 1 = plain conditional
  double shift = 1.0;       // same α as training
  int64_t null_class = -1;  // label of the unconditional branch (required when cfg_scale != 1)
};

// The time grid 1 = t_0 > t_1 > … > t_N = 0: linspace(1, 0, N + 1), then shifted.
at::Tensor sampling_times(int64_t steps, double shift);

// Integrates from noise (t = 1) to data (t = 0). Euler: x += (t_next − t)·v. Heun: the
// trapezoidal corrector on every step but the last (which is Euler, as t_next = 0 there).
// With classifier-free guidance the conditional and unconditional batches run as one.
at::Tensor sample(const VelocityFn& model, const at::Tensor& noise, const at::Tensor& labels,
                  const SamplerOptions& options);

}  // namespace flowtrain::models
