// A small CNN classifier for Fashion-MNIST, trained by the project itself (trainer/
// classifier_cache.h) because no Inception weights can be downloaded offline. Its penultimate
// activations are the feature space of flowtrain's Fréchet distance (FID's recipe with a
// Fashion-MNIST network instead of Inception-v3), its softmax the p(y|x) of the class accuracy
// and inception-style score (trainer/eval/quality.h).
//
//   x [B, 1, 28, 28] in [−1, 1]
//   ─ conv1 3×3 1→32   ─ bn1 ─ ReLU ─ maxpool 2 ─▶ [B, 32, 14, 14]
//   ─ conv2 3×3 32→64  ─ bn2 ─ ReLU ─ maxpool 2 ─▶ [B, 64, 7, 7]
//   ─ conv3 3×3 64→128 ─ bn3 ─ ReLU ─ maxpool 2 ─▶ [B, 128, 3, 3] ─ flatten [B, 1152]
//   ─ fc1 1152→256 ─▶ features [B, 256] (pre-activation: closer to Gaussian, as FD assumes)
//   ─ ReLU ─ fc2 256→10 ─▶ logits [B, 10]
//
// Sized for 2 CPU cores (≈ 8 M multiply-adds per image, a few epochs in minutes) while reaching
// > 90 % test accuracy; batch norm makes those few epochs enough.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

namespace flowtrain::models {

struct FashionClassifierImpl : torch::nn::Module {
  static constexpr int64_t kImageSide = 28;
  static constexpr int64_t kNumClasses = 10;
  static constexpr int64_t kFeatureDim = 256;

  // Initialisation is a pure function of `seed` (PyTorch's default Conv/Linear init, drawn from
  // a generator of our own); the global CPU generator is left exactly as it was, so building a
  // classifier in the middle of a training run (periodic eval) changes none of the run's draws.
  explicit FashionClassifierImpl(uint64_t seed = 0);

  // x [B, 1, S, S], S >= 28, values in [−1, 1] (the training data's scale: uint8 / 127.5 − 1).
  // S > 28 is cropped to the central 28×28, undoing the centred padding the data loader applies
  // when model.image_size exceeds the data (32 for the reference DiT's latent size), so a DiT
  // trained on padded images is scored on the pixels that came from the data. Throws
  // std::invalid_argument naming the shape for anything else.
  at::Tensor forward(const at::Tensor& x);   // -> logits [B, 10]
  at::Tensor features(const at::Tensor& x);  // -> penultimate activations [B, 256]
  at::Tensor head(const at::Tensor& features);  // features [B, 256] -> logits [B, 10]

  void reset_parameters(uint64_t seed);

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(FashionClassifier);

// uint8 images [N, 1, H, W] (0…255) -> float [N, 1, H, W] in [−1, 1], the classifier's input scale.
at::Tensor classifier_input_from_uint8(const at::Tensor& images);

struct ClassifierOutputs {
  at::Tensor features;  // float32 [N, 256], CPU
  at::Tensor logits;    // float32 [N, 10], CPU
};

// Runs the classifier over a whole image set in eval mode under at::NoGradGuard, batch_size
// images at a time on the model's device (the set itself may stay on the CPU). images: uint8
// [N, 1, S, S] (0…255) or floating point in [−1, 1]. The model's train/eval mode is restored.
ClassifierOutputs classify_images(FashionClassifier& model, const at::Tensor& images, int64_t batch_size = 500);

}  // namespace flowtrain::models
