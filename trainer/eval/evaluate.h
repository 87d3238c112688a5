// Model-quality evaluation of class-conditional models: `flowtrain eval`, and every eval.every
// steps during training, through make_class_conditional_evaluator (trainer/eval/evaluator.h says
// which runs are judged how).
//
// eval.num class-conditional samples (image i of class i % 10, noise from eval.seed, the eval
// section's sampler / steps / CFG and the run's time shift) are scored by the project's Fashion-MNIST
// classifier (trainer/eval/classifier_cache.h):
//   fd                        Fréchet distance between the samples' and eval.num real training
//                             images' penultimate classifier features (FID's formula, our network)
//   fd_floor                  the same distance between eval.num real test images and those
//                             training images: what a perfect model would score at this N (FD is
//                             biased upwards at finite N, so fd is read against fd_floor)
//   class_accuracy            fraction of samples the classifier assigns to the requested class
//   inception_score           exp(E_x KL(p(y|x) ‖ p(y))) of the classifier (10 at best)
//   classifier_test_accuracy  the classifier's own accuracy on the test split
// Both real subsets hold exactly as many images of each class as the samples do (the k-th
// sample of class c is matched by the k-th image of class c in a fixed shuffle), so class
// proportions never enter the distances. The real statistics are computed once per process.
#pragma once

#include "models/flow_matching.h"
#include "models/model.h"
#include "trainer/eval/sample_grid.h"
#include "trainer/config/config.h"

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>

namespace flowtrain::trainer {

struct QualityReport {
  double fd = 0.0;
  double fd_floor = 0.0;
  double class_accuracy = 0.0;
  double inception_score = 0.0;
  double classifier_test_accuracy = 0.0;
  int64_t num = 0;
  // trainer/eval/validation_loss.h on the whole test split (10,000 images), noise from
  // eval.seed: the fit on held-out data, far less noisy than logged training losses. Computed by
  // evaluate_model and evaluate_checkpoint (not by training's periodic evaluation); NaN there.
  double val_loss = std::numeric_limits<double>::quiet_NaN();

  // One line: {"fd":…,"fd_floor":…,"class_accuracy":…,"inception_score":…,
  // "classifier_test_accuracy":…,"num":…[,"val_loss":…]}
  std::string to_json() const;
};

// Throws ConfigError naming the key when the quality metrics cannot score this config (the
// requirements below). The trainer checks at start when eval.every > 0 (Evaluator::check).
void check_eval_config(const Config& config, const models::DiffusionModel& model);

// Scores `model` as it is (pass the EMA model to score EMA weights) on `device`. Needs
// data.source = fashion_mnist (the classifier's data set, read from data.path), in_channels 1,
// image_size >= 28, num_classes >= 10 and eval.num <= 10000 (the test split's size); throws
// ConfigError naming the key otherwise. Trains the classifier first if it is not cached in
// eval.classifier_dir. The model's train/eval mode is restored. Samples in the training
// precision (train.precision bf16: under autocast), as training's evaluations do. =
// generate_eval_samples, then score_eval_samples.
// `conditioning`: RunConditioning::of_eval_rows (row i of class i % 10).
QualityReport evaluate_model(models::DiffusionModel& model, const RowConditioning& conditioning, const Config& config,
                             const c10::Device& device);

// Builds the model from config.model, loads the checkpoint's EMA weights (its raw weights when it
// has none or `raw` is set), evaluates on run.device with eval.num = num_override (0 = keep
// eval.num) and writes the report atomically to CheckpointModel::report_path.
QualityReport evaluate_checkpoint(const Config& config, const std::string& checkpoint_dir, int64_t num_override = 0,
                                  bool raw = false);

// Rows [first, first + count) (count < 0: all eval.num) of the evaluation's samples, integrated
// with `velocity` (the caller sets eval mode and no-grad): [count, C, S, S] uint8, the model's
// outputs clamped to [−1, 1] and quantised to 8 bits as a saved image would be (the real images
// are 8-bit too). Noise for all samples is drawn up front from eval.seed, then integrated ≤ 250
// rows at a time, so the result does not depend on the batching or on how rows are split over
// ranks (rows past eval.num repeat the last one: padding, see padded_rows).
at::Tensor generate_eval_samples(const models::VelocityFn& velocity, const models::DiffusionModel& model,
                                 const RowConditioning& conditioning, const Config& config, const c10::Device& device,
                                 int64_t first = 0, int64_t count = -1);
// All eval.num rows from `model` as it is (eval mode and no-grad set here, its mode restored; under
// autocast when train.precision is bf16, as training's evaluations).
at::Tensor generate_eval_samples(models::DiffusionModel& model, const RowConditioning& conditioning, const Config& config,
                                 const c10::Device& device);

// What a judge of a checkpoint scores: the checkpoint's model built from config.model with its EMA
// weights (raw when it has none or `raw` is set), on run.device, checked by `check` (a ConfigError
// naming the key when it cannot be judged), then eval.num (num_override > 0: that many) samples
// of its evaluation rows. The judge writes its report to report_path.
struct CheckpointEvalSamples {
  Config config;  // eval.num as used
  c10::Device device = c10::Device(c10::kCPU);
  std::shared_ptr<models::DiffusionModel> model;  // in eval mode, on the device
  at::Tensor samples;  // generate_eval_samples' uint8 samples
  RowConditioning eval_rows;  // the conditioning of the evaluation's rows
  std::string report_path;
};
using EvalConfigCheck = std::function<void(const Config&, const models::DiffusionModel&)>;
CheckpointEvalSamples generate_checkpoint_eval_samples(const Config& config, const std::string& checkpoint_dir,
                                                       int64_t num_override, bool raw, const EvalConfigCheck& check);

// The metrics of eval.num samples from generate_eval_samples (checks the config as
// evaluate_model does).
QualityReport score_eval_samples(const at::Tensor& samples, const models::DiffusionModel& model, const Config& config,
                                 const c10::Device& device);

}  // namespace flowtrain::trainer
