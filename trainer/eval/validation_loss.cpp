#include "trainer/eval/validation_loss.h"

#include "trainer/frozen/frozen_sampling.h"
#include "trainer/frozen/online_encoding.h"

#include "data/loader.h"
#include "models/autocast_region.h"
#include "models/flow_matching.h"
#include "trainer/builders.h"

#include <ATen/CPUGeneratorImpl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

namespace flowtrain::trainer {

namespace {
constexpr int64_t kBatch = 250;  // rows per forward: bounds memory on small GPUs / the CPU
}

double validation_loss(models::DiffusionModel& model, const at::Tensor& images_u8,
                       const models::Conditioning& conditioning, const Config& config, const c10::Device& device,
                       uint64_t seed, const std::string& what) {
  const int64_t n = images_u8.size(0);
  TORCH_CHECK(n > 0, "validation_loss: no images");
  const auto start = std::chrono::steady_clock::now();
  // A latent model (model.autoencoder) is judged on the held-out images' latents.
  const at::Tensor x0_all = pixels_to_model_space(config, data::model_input_images(images_u8, data_input(config).image_size));
  // Every draw up front on the CPU, so neither the device nor the batching changes them.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor noise_all = at::randn(x0_all.sizes(), gen, x0_all.options());
  const at::Tensor t_all = models::shift_time((at::arange(n, at::kDouble) + 0.5).div(n).to(at::kFloat), time_shift(config));

  const bool was_training = model.is_training();
  model.eval();
  double sum = 0.0;
  {
    at::NoGradGuard no_grad;
    models::AutocastRegion autocast(config.train.bf16_autocast(), device.type());
    const models::VelocityFn velocity = [&](const at::Tensor& x, const at::Tensor& t, const models::Conditioning& c) {
      return model.forward(x, t, c);
    };
    for (int64_t first = 0; first < n; first += kBatch) {
      const int64_t rows = std::min(kBatch, n - first);
      models::FlowMatchingDraw draw;
      draw.t = t_all.narrow(0, first, rows).to(device);
      draw.noise = noise_all.narrow(0, first, rows).to(device);
      draw.cond = conditioning.rows(first, rows).to(device);
      const at::Tensor x0 = x0_all.narrow(0, first, rows).to(device);
      // The loss is a mean over equal-size rows: weight each batch by its rows.
      sum += models::flow_matching_loss(velocity, x0, draw).loss.item<double>() * static_cast<double>(rows);
    }
  }
  model.train(was_training);
  const double loss = sum / static_cast<double>(n);
  spdlog::info("eval: held-out flow-matching loss {:.6f} on {} {} ({:.1f} s)", loss, n, what,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return loss;
}

}  // namespace flowtrain::trainer
