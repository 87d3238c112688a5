#include "trainer/eval/sample_grid.h"

#include "data/png.h"
#include "data/video.h"
#include "trainer/checkpoint/file_util.h"
#include "trainer/builders.h"
#include "trainer/frozen/frozen_sampling.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fmt/format.h>

namespace flowtrain::trainer {

at::Tensor padded_rows(const at::Tensor& all, int64_t first, int64_t count) {
  const int64_t n = all.size(0);
  if (count < 0) return all;
  at::Tensor index = at::arange(first, first + count, at::TensorOptions().dtype(at::kLong)).clamp_max(n - 1);
  return all.index_select(0, index.to(all.device()));
}

models::SamplerOptions sampler_options(models::SamplerKind sampler, int64_t steps, double cfg_scale, double shift) {
  models::SamplerOptions so;
  so.kind = sampler;
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
  return samples_to_pixels(c, sample_rows(velocity, model, conditioning, s.num, s.seed,
                                          sampler_options(s.sampler, s.steps, s.cfg_scale, time_shift(c)), device,
                                          first, count));
}

at::Tensor sample_grid_image(const at::Tensor& samples, int64_t columns) {
  if (samples.dim() == 5) {  // clips [N, C, T, H, W]: one clip a row, its frames left to right
    const int64_t N = samples.size(0), C = samples.size(1), T = samples.size(2);
    const at::Tensor frames = samples.permute({0, 2, 1, 3, 4}).reshape({N * T, C, samples.size(3), samples.size(4)});
    return data::make_image_grid(frames.to(at::kFloat), T, /*padding=*/2);
  }
  const int64_t nrow = std::min<int64_t>(columns, samples.size(0));
  return data::make_image_grid(samples.to(at::kFloat), nrow, /*padding=*/2);
}

std::vector<std::string> write_sample_videos(const std::string& grid_path, const at::Tensor& clips, int64_t fps) {
  const std::filesystem::path grid(grid_path);
  const std::filesystem::path dir = grid.parent_path() / grid.stem();
  std::filesystem::create_directories(dir);
  std::vector<std::string> written;
  for (int64_t i = 0; i < clips.size(0); ++i) {
    // [C, T, H, W] in [−1, 1] -> uint8 [T, H, W, 3]
    const at::Tensor rgb = ((clips[i].to(at::kFloat).clamp(-1, 1) + 1) * 127.5).round().to(at::kByte);
    at::Tensor frames = rgb.permute({1, 2, 3, 0});
    if (frames.size(3) == 1) frames = frames.expand({-1, -1, -1, 3});
    const std::string path = (dir / fmt::format("{:05d}.mp4", i)).string();
    write_file_atomic(path, data::encode_video_lossless(frames.contiguous(), fps));
    written.push_back(path);
  }
  return written;
}

int64_t sample_video_fps(const Config& config) {
  return config.data.video_fps > 0 ? std::max<int64_t>(1, std::llround(config.data.video_fps)) : kDefaultSampleFps;
}

at::Tensor write_sample_grid(const std::string& path, const at::Tensor& samples, int64_t columns, int64_t video_fps) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  at::Tensor grid = sample_grid_image(samples, columns);
  data::write_png(path, grid);
  if (samples.dim() == 5 && data::video_supported()) write_sample_videos(path, samples, video_fps);
  return grid;
}

}  // namespace flowtrain::trainer
