#include "trainer/eval/sample_grid.h"

#include "data/png.h"
#include "trainer/builders.h"

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>

namespace flowtrain::trainer {

at::Tensor padded_rows(const at::Tensor& all, int64_t first, int64_t count) {
  const int64_t n = all.size(0);
  if (count < 0) return all;
  at::Tensor index = at::arange(first, first + count, at::TensorOptions().dtype(at::kLong)).clamp_max(n - 1);
  return all.index_select(0, index.to(all.device()));
}

models::SamplerOptions sampler_options(const std::string& sampler, int64_t steps, double cfg_scale, double shift) {
  models::SamplerOptions so;
  so.kind = models::parse_sampler(sampler);
  so.steps = steps;
  so.cfg_scale = cfg_scale;
  so.shift = shift;
  return so;
}

at::Tensor sample_noise(const models::DiffusionModel& model, int64_t num, int64_t seed) {
  std::vector<int64_t> shape = model.sample_shape();
  shape.insert(shape.begin(), num);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
  return at::randn(shape, gen);
}

at::Tensor sample_rows(const models::VelocityFn& velocity, const models::DiffusionModel& model,
                       const RowConditioning& conditioning, int64_t num, int64_t seed,
                       const models::SamplerOptions& options, const c10::Device& device, int64_t first,
                       int64_t count) {
  at::Tensor noise = padded_rows(sample_noise(model, num, seed), first, count).to(device);
  at::Tensor rows = padded_rows(at::arange(num, at::TensorOptions().dtype(at::kLong)), first, count);
  const models::Conditioning cond = conditioning(rows).to(device);
  return models::sample(velocity, noise, cond, model.null_conditioning(cond), options).to(at::kCPU);
}

at::Tensor generate_samples(const models::VelocityFn& velocity, const models::DiffusionModel& model,
                            const RowConditioning& conditioning, const Config& c, const c10::Device& device,
                            int64_t first, int64_t count) {
  const SampleConfig& s = c.sample;
  return sample_rows(velocity, model, conditioning, s.num, s.seed,
                     sampler_options(s.sampler, s.steps, s.cfg_scale, time_shift(c)), device, first, count);
}

at::Tensor sample_grid_image(const at::Tensor& samples, int64_t columns) {
  const int64_t nrow = std::min<int64_t>(columns, samples.size(0));
  return data::make_image_grid(samples.to(at::kFloat), nrow, /*padding=*/2);
}

void write_sample_grid(const std::string& path, const at::Tensor& samples, int64_t columns) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  data::write_png(path, sample_grid_image(samples, columns));
}

}  // namespace flowtrain::trainer
