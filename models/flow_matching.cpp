#include "models/flow_matching.h"

#include <ATen/CPUGeneratorImpl.h>

#include <stdexcept>

namespace flowtrain::models {

TimestepDistribution parse_timestep_distribution(const std::string& name) {
  if (name == "uniform") return TimestepDistribution::Uniform;
  if (name == "logit_normal") return TimestepDistribution::LogitNormal;
  throw std::invalid_argument("unknown timestep distribution '" + name + "' (uniform|logit_normal)");
}

SamplerKind parse_sampler(const std::string& name) {
  if (name == "euler") return SamplerKind::Euler;
  if (name == "heun") return SamplerKind::Heun;
  throw std::invalid_argument("unknown sampler '" + name + "' (euler|heun)");
}

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

at::Tensor drop_labels(const at::Tensor& labels, double p, int64_t null_class, at::Generator& gen) {
  if (p <= 0) return labels;
  at::Tensor drop = at::rand({labels.size(0)}, gen, at::TensorOptions().dtype(at::kFloat).device(gen.device()))
                       .lt(p)
                       .to(labels.device());
  return at::where(drop, at::full_like(labels, null_class), labels);
}

FlowMatchingDraw draw_flow_matching_inputs(const at::Tensor& x0, const at::Tensor& labels,
                                           const TimestepSampler& timesteps, double label_dropout,
                                           int64_t null_class, at::Generator& gen) {
  // Drawn on the generator's device (a CPU generator gives the same draws whatever device the
  // model trains on), then moved to x0's.
  FlowMatchingDraw d;
  d.t = timesteps.sample(x0.size(0), gen, x0.options());
  d.noise = at::randn(x0.sizes(), gen, x0.options().device(gen.device())).to(x0.device());
  d.labels = drop_labels(labels, label_dropout, null_class, gen);
  return d;
}

FlowMatchingDraw draw_flow_matching_inputs_per_row(const at::Tensor& x0, const at::Tensor& labels,
                                                   const TimestepSampler& timesteps, double label_dropout,
                                                   int64_t null_class, const std::function<uint64_t(int64_t)>& row_seed,
                                                   int64_t first_row) {
  const int64_t n = x0.size(0);
  const auto cpu_float = at::TensorOptions().dtype(at::kFloat);
  std::vector<at::Tensor> ts, noises, drops;
  for (int64_t i = 0; i < n; ++i) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(row_seed(first_row + i));
    ts.push_back(timesteps.sample(1, gen, cpu_float));
    noises.push_back(at::randn(x0[i].sizes(), gen, x0.options().device(at::kCPU)));
    if (label_dropout > 0) drops.push_back(at::rand({1}, gen, cpu_float));
  }
  FlowMatchingDraw d;
  d.t = at::cat(ts).to(x0.options());
  d.noise = at::stack(noises).to(x0.device());
  d.labels = labels;
  if (label_dropout > 0) {
    at::Tensor drop = at::cat(drops).lt(label_dropout).to(labels.device());
    d.labels = at::where(drop, at::full_like(labels, null_class), labels);
  }
  return d;
}

FlowMatchingLoss flow_matching_loss(const VelocityFn& model, const at::Tensor& x0, const FlowMatchingDraw& d) {
  at::Tensor x_t = interpolate(x0, d.noise, d.t);
  at::Tensor target = d.noise - x0;
  at::Tensor v = model(x_t, d.t, d.labels);
  if (v.size(1) != x0.size(1)) v = v.narrow(1, 0, x0.size(1));  // learn-sigma: use the first C channels
  return {at::mse_loss(v.to(at::kFloat), target.to(at::kFloat)), d.t};
}

FlowMatchingLoss flow_matching_loss(const VelocityFn& model, const at::Tensor& x0, const at::Tensor& labels,
                                    const TimestepSampler& timesteps, double label_dropout,
                                    int64_t null_class, at::Generator& gen) {
  return flow_matching_loss(model, x0, draw_flow_matching_inputs(x0, labels, timesteps, label_dropout, null_class, gen));
}

at::Tensor sampling_times(int64_t steps, double shift) {
  return shift_time(at::linspace(1.0, 0.0, steps + 1, at::TensorOptions().dtype(at::kDouble)), shift);
}

at::Tensor sample(const VelocityFn& model, const at::Tensor& noise, const at::Tensor& labels,
                  const SamplerOptions& o) {
  const bool guided = o.cfg_scale != 1.0;
  if (guided && o.null_class < 0) throw std::invalid_argument("sample: cfg_scale != 1 needs a null class");
  at::NoGradGuard no_grad;
  const int64_t channels = noise.size(1);

  auto velocity = [&](const at::Tensor& x, double t) {
    const int64_t B = x.size(0);
    at::Tensor v;
    if (guided) {
      at::Tensor xx = at::cat({x, x});
      at::Tensor yy = at::cat({labels, at::full_like(labels, o.null_class)});
      at::Tensor out = model(xx, at::full({2 * B}, t, x.options()), yy).narrow(1, 0, channels);
      at::Tensor v_cond = out.narrow(0, 0, B), v_uncond = out.narrow(0, B, B);
      v = v_uncond + o.cfg_scale * (v_cond - v_uncond);
    } else {
      v = model(x, at::full({B}, t, x.options()), labels).narrow(1, 0, channels);
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
