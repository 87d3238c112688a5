#include "trainer/eval/sample_grid.h"

#include "data/png.h"

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>

namespace flowtrain::trainer {

at::Tensor padded_rows(const at::Tensor& all, int64_t first, int64_t count) {
  const int64_t n = all.size(0);
  if (count < 0) return all;
  at::Tensor index = at::arange(first, first + count, at::TensorOptions().dtype(at::kLong)).clamp_max(n - 1);
  return all.index_select(0, index.to(all.device()));
}

at::Tensor generate_samples(const models::VelocityFn& velocity, const models::DiTOptions& o,
                            const SampleConfig& sample, const FlowConfig& flow, int64_t num_classes,
                            const c10::Device& device, int64_t first, int64_t count) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(sample.seed));
  at::Tensor noise = at::randn({sample.num, o.in_channels, o.input_size, o.input_size}, gen);
  at::Tensor labels = at::arange(sample.num, at::TensorOptions().dtype(at::kLong)) % num_classes;

  models::SamplerOptions so;
  so.kind = models::parse_sampler(sample.sampler);
  so.steps = sample.steps;
  so.cfg_scale = sample.cfg_scale;
  so.shift = flow.shift;
  so.null_class = o.num_classes;
  return models::sample(velocity, padded_rows(noise, first, count).to(device),
                        padded_rows(labels, first, count).to(device), so)
      .to(at::kCPU);
}

at::Tensor generate_samples(models::DiT& model, const SampleConfig& sample, const FlowConfig& flow,
                            int64_t num_classes, const c10::Device& device) {
  const bool was_training = model->is_training();
  model->eval();
  at::NoGradGuard no_grad;
  models::VelocityFn velocity = [&](const at::Tensor& x, const at::Tensor& t, const at::Tensor& y) {
    return model->forward(x, t, y);
  };
  at::Tensor out = generate_samples(velocity, model->options, sample, flow, num_classes, device);
  model->train(was_training);
  return out;
}

at::Tensor sample_grid_image(const at::Tensor& samples, int64_t num_classes) {
  const int64_t nrow = std::min<int64_t>(num_classes, samples.size(0));
  return data::make_image_grid(samples.to(at::kFloat), nrow, /*padding=*/2);
}

void write_sample_grid(const std::string& path, const at::Tensor& samples, int64_t num_classes) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  data::write_png(path, sample_grid_image(samples, num_classes));
}

}  // namespace flowtrain::trainer
