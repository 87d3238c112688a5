// The evaluation of a model trained by an objective of its own (trainer/family.h, the
// autoencoder): how well it reconstructs images it never trained on.
//   data.source compositions   the eval split's canvases (data.path/eval_images.safetensors)
//   data.source fashion_mnist  the test split
// PSNR over pixels in [0, 1]: per image 10·log10(1 / MSE), averaged over the images, and that of
// the mean MSE over all of them; also the mean absolute error. Only `flowtrain eval` runs it (the
// family is not sampled, so training's periodic evaluation is refused at config time).
#include "data/compositions.h"
#include "data/fashion_mnist.h"
#include "data/loader.h"
#include "trainer/builders.h"
#include "trainer/checkpoint/file_util.h"
#include "trainer/eval/checkpoint_model.h"
#include "trainer/eval/evaluator.h"
#include "trainer/family.h"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace flowtrain::trainer {

namespace {

at::Tensor held_out_images(const Config& c) {
  if (c.data.source == DataSource::compositions) return data::load_compositions(c.data.path, "eval").images;
  if (c.data.source == DataSource::fashion_mnist) return data::load_fashion_mnist(c.data.path, "test").images;
  throw ConfigError(fmt::format("reconstruction is evaluated on the held-out split of data.source compositions or "
                                "fashion_mnist; data.source is '{}'",
                                name_of(c.data.source)));
}

class ReconstructionEvaluator : public Evaluator {
 public:
  std::string name() const override { return "reconstruction"; }
  void check(const Config& config, const models::DiffusionModel&) const override {
    throw ConfigError(fmt::format("model.arch {} is evaluated on a checkpoint by `flowtrain eval`; set eval.every 0",
                                  config.model.arch));
  }
  EvalScores score(const at::Tensor&, const models::DiffusionModel&, const Config& config,
                   const c10::Device&) const override {
    throw ConfigError(fmt::format("model.arch {} is not sampled: nothing to score", config.model.arch));
  }
  std::string evaluate_checkpoint(const Config& config, const std::string& checkpoint_dir, int64_t num_override,
                                  bool raw) const override {
    const int64_t num = num_override > 0 ? num_override : config.eval.num;
    const at::Tensor all = held_out_images(config);
    const at::Tensor images = all.narrow(0, 0, std::min<int64_t>(num, all.size(0)));
    const c10::Device device = select_device(config.run);
    CheckpointModel cm = load_checkpoint_model(config, checkpoint_dir, raw, device);
    const FamilySpec& family = model_family(config.model.arch);
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> mse, mae;
    constexpr int64_t kBatch = 64;
    for (int64_t first = 0; first < images.size(0); first += kBatch) {
      const int64_t n = std::min<int64_t>(kBatch, images.size(0) - first);
      const at::Tensor x = data::model_input_images(images.narrow(0, first, n), config.model.image_size).to(device);
      const at::Tensor x_hat = family.objective->reconstruct(*cm.model, x).to(at::kFloat).clamp(-1.0, 1.0);
      const at::Tensor error = ((x_hat - x) / 2.0).cpu();  // on the [0, 1] scale
      mse.push_back(error.pow(2).flatten(1).mean(1));
      mae.push_back(error.abs().flatten(1).mean(1));
    }
    const at::Tensor per_image_mse = at::cat(mse).to(at::kDouble);
    const double psnr = (10.0 * at::log10(1.0 / per_image_mse.clamp_min(1e-12))).mean().item<double>();
    const double psnr_of_mean = 10.0 * std::log10(1.0 / per_image_mse.mean().item<double>());
    const double l1 = at::cat(mae).mean().item<double>();
    const nlohmann::json report = {{"checkpoint", checkpoint_dir},
                                   {"step", cm.step},
                                   {"weights", cm.ema ? "ema" : "raw"},
                                   {"images", per_image_mse.size(0)},
                                   {"psnr_db", psnr},
                                   {"psnr_of_mean_mse_db", psnr_of_mean},
                                   {"mean_abs_error", l1}};
    spdlog::info("eval {} (step {}, {} weights, {} held-out images): PSNR {:.2f} dB (of the mean MSE {:.2f} dB), mean "
                 "absolute error {:.4f} on [0, 1]",
                 checkpoint_dir, cm.step, cm.ema ? "EMA" : "raw", per_image_mse.size(0), psnr, psnr_of_mean, l1);
    write_file_atomic(cm.report_path, report.dump(2) + "\n");
    return report.dump(2);
  }
};

}  // namespace

std::unique_ptr<Evaluator> make_reconstruction_evaluator() { return std::make_unique<ReconstructionEvaluator>(); }

}  // namespace flowtrain::trainer
