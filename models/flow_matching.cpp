#include "models/flow_matching.h"

#include <ATen/CPUGeneratorImpl.h>

#include <stdexcept>

namespace flowtrain::models {

at::Tensor shift_time(const at::Tensor& t, double alpha) {
  if (alpha == 1.0) return t;
  return alpha * t / (1 + (alpha - 1) * t);
}

at::Tensor TimestepSampler::sample(int64_t n, at::Generator& gen, const at::TensorOptions& options) const {
  // Drawn in fp32 on the generator's device, then moved: the draw is the same on any device
  // the caller trains on only if the generator is a CPU one.
  const auto on_gen = at::TensorOptions().dtype(at::kFloat).device(gen.device());
  at::Tensor t;
  if (distribution == TimestepDistribution::Uniform) {
    t = at::rand({n}, gen, on_gen);
  } else {
    t = at::sigmoid(at::randn({n}, gen, on_gen) * logit_std + logit_mean);
  }
  return shift_time(t, shift).to(options);
}

static at::Tensor broadcast_time(const at::Tensor& t, const at::Tensor& like) {
  std::vector<int64_t> shape(like.dim(), 1);
  shape[0] = t.size(0);
  return t.reshape(shape);
}

at::Tensor interpolate(const at::Tensor& x0, const at::Tensor& noise, const at::Tensor& t) {
  at::Tensor tb = broadcast_time(t, x0);
  return (1 - tb) * x0 + tb * noise;
}

namespace {

// One uniform per dropout entry, drawn on the generator: the k-th mask is u_k < p_k.
std::vector<at::Tensor> draw_drop_uniforms(const ConditioningDropout& dropout, int64_t n, at::Generator& gen) {
  std::vector<at::Tensor> u;
  for (double p : dropout.probabilities)
    if (p > 0) u.push_back(at::rand({n}, gen, at::TensorOptions().dtype(at::kFloat).device(gen.device())));
  return u;
}

Conditioning apply_dropout(const ConditioningDropout& dropout, const Conditioning& cond,
                           const std::vector<at::Tensor>& uniforms) {
  if (uniforms.empty()) return cond;
  std::vector<at::Tensor> dropped;
  size_t k = 0;
  for (double p : dropout.probabilities)
    if (p > 0) dropped.push_back(uniforms[k++].lt(p));
  return dropout.apply(cond, dropped);
}

}  // namespace

FlowMatchingDraw draw_flow_matching_inputs(const at::Tensor& x0, const Conditioning& cond,
                                           const TimestepSampler& timesteps, const ConditioningDropout& dropout,
                                           at::Generator& gen) {
  // Drawn on the generator's device (a CPU generator gives the same draws whatever device the
  // model trains on), then moved to x0's.
  FlowMatchingDraw d;
  d.t = timesteps.sample(x0.size(0), gen, x0.options());
  d.noise = at::randn(x0.sizes(), gen, x0.options().device(gen.device())).to(x0.device());
  d.cond = apply_dropout(dropout, cond, draw_drop_uniforms(dropout, x0.size(0), gen));
  return d;
}

FlowMatchingDraw draw_flow_matching_inputs_per_row(const at::Tensor& x0, const Conditioning& cond,
                                                   const TimestepSampler& timesteps,
                                                   const ConditioningDropout& dropout,
                                                   const std::function<uint64_t(int64_t)>& row_seed,
                                                   int64_t first_row) {
  const int64_t n = x0.size(0);
  const auto cpu_float = at::TensorOptions().dtype(at::kFloat);
  std::vector<at::Tensor> ts, noises;
  std::vector<std::vector<at::Tensor>> uniforms;  // [row][entry]
  for (int64_t i = 0; i < n; ++i) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(row_seed(first_row + i));
    ts.push_back(timesteps.sample(1, gen, cpu_float));
    noises.push_back(at::randn(x0[i].sizes(), gen, x0.options().device(at::kCPU)));
    uniforms.push_back(draw_drop_uniforms(dropout, 1, gen));
  }
  FlowMatchingDraw d;
  d.t = at::cat(ts).to(x0.options());
  d.noise = at::stack(noises).to(x0.device());
  std::vector<at::Tensor> per_entry;
  for (size_t k = 0; k < (uniforms.empty() ? 0 : uniforms[0].size()); ++k) {
    std::vector<at::Tensor> column;
    for (const auto& row : uniforms) column.push_back(row[k]);
    per_entry.push_back(at::cat(column));
  }
  d.cond = apply_dropout(dropout, cond, per_entry);
  return d;
}

FlowMatchingLoss flow_matching_loss(const VelocityFn& model, const at::Tensor& x0, const FlowMatchingDraw& d) {
  at::Tensor x_t = interpolate(x0, d.noise, d.t);
  at::Tensor target = d.noise - x0;
  at::Tensor v = model(x_t, d.t, d.cond);
  if (v.size(1) != x0.size(1)) v = v.narrow(1, 0, x0.size(1));  // learn-sigma: use the first C channels
  // mse_loss itself, bit-equal to PyTorch's; its backward keeps v and the target alive anyway.
  return {at::mse_loss(v.to(at::kFloat), target.to(at::kFloat)), d.t, v.detach(), target.detach()};
}

at::Tensor per_sample_loss(const FlowMatchingLoss& l) {
  return (l.prediction.to(at::kFloat) - l.target.to(at::kFloat)).pow(2).flatten(1).mean(1);
}

at::Tensor sampling_times(int64_t steps, double shift) {
  return shift_time(at::linspace(1.0, 0.0, steps + 1, at::TensorOptions().dtype(at::kDouble)), shift);
}

at::Tensor sample(const VelocityFn& model, const at::Tensor& noise, const Conditioning& cond,
                  const Conditioning& null_cond, const SamplerOptions& o) {
  const bool guided = o.cfg_scale != 1.0;
  at::NoGradGuard no_grad;
  const int64_t channels = noise.size(1);
  const Conditioning both = guided ? Conditioning::cat(cond, null_cond) : Conditioning();

  auto velocity = [&](const at::Tensor& x, double t) {
    const int64_t B = x.size(0);
    at::Tensor v;
    if (guided) {
      at::Tensor out = model(at::cat({x, x}), at::full({2 * B}, t, x.options()), both).narrow(1, 0, channels);
      at::Tensor v_cond = out.narrow(0, 0, B), v_uncond = out.narrow(0, B, B);
      v = v_uncond + o.cfg_scale * (v_cond - v_uncond);
    } else {
      v = model(x, at::full({B}, t, x.options()), cond).narrow(1, 0, channels);
    }
    return v.to(x.scalar_type());
  };

  at::Tensor times = sampling_times(o.steps, o.shift);
  auto t_at = [&](int64_t i) { return times[i].item<double>(); };
  at::Tensor x = noise.clone();
  for (int64_t i = 0; i < o.steps; ++i) {
    const double t = t_at(i), t_next = t_at(i + 1), dt = t_next - t;
    at::Tensor v = velocity(x, t);
    if (o.kind == SamplerKind::Heun && t_next > 0) {
      at::Tensor x_euler = x + dt * v;
      x = x + dt * 0.5 * (v + velocity(x_euler, t_next));
    } else {
      x = x + dt * v;
    }
  }
  return x;
}

}  // namespace flowtrain::models
