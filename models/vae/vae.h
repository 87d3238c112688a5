// The FLUX autoencoder as a network flowtrain trains (model.arch autoencoder): the encoder and
// decoder of models/autoencoder/autoencoder.h under the release's key names (encoder.*,
// decoder.*), so an exported checkpoint is an ae.safetensors that model.autoencoder loads and the
// reference code reads. Trained as a VAE (Kingma & Welling; the latent-diffusion recipe without
// its perceptual and adversarial terms):
//
//   (mean, logvar) = encoder(x)            logvar clamped to [-30, 20] as latent diffusion does
//   z = mean + exp(logvar / 2) · ε          ε ~ N(0, I), one draw per sample
//   x̂ = decoder(z)                          an unscaled latent (scale and shift are the export's)
//   loss(x) = mean((x̂ − x)²) + kl_weight · mean(½ (mean² + exp(logvar) − 1 − logvar))
//
// Each of encoder and decoder is one unit (FSDP gathers it, activation checkpointing recomputes
// it). An autoencoder has no velocity: forward(x, t, cond) is an error; the family's objective
// calls loss() and its evaluation reconstruct().
#pragma once

#include "models/autoencoder/autoencoder.h"
#include "models/model.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace flowtrain::models {

class VaeModel : public DiffusionModel {
 public:
  // `image_size`: the side of the images it is trained on (its cost and sample shape).
  VaeModel(AutoencoderOptions options, int64_t image_size);

  LatentMoments moments(const at::Tensor& x);   // unit 0: x [B, C, H, W] in [-1, 1]
  at::Tensor decode(const at::Tensor& z);       // unit 1: an unscaled latent -> images
  // Per-sample losses [B] of the formula above; `eps` is ε, [B, z, H/f, W/f] (the caller draws it,
  // per sample, so a batch split over ranks draws the same).
  at::Tensor loss(const at::Tensor& x, const at::Tensor& eps, double kl_weight);
  at::Tensor reconstruct(const at::Tensor& x);  // decoder(mean): no draw

  at::Tensor forward(const at::Tensor& x, const at::Tensor& t, const Conditioning& cond) override;
  std::vector<int64_t> sample_shape() const override;
  int64_t tokens_per_sample() const override;  // latent cells
  std::string token_layout() const override;
  int64_t attention_heads() const override { return 1; }
  double train_flops_per_sample() const override;
  std::string describe() const override;
  ConditioningDropout conditioning_dropout() const override { return {}; }
  Conditioning null_conditioning(const Conditioning& cond) const override { return cond; }
  UnitPlan units() const override { return {{}, {"encoder", "decoder"}, {}}; }
  void set_attention(const AttentionFn& attention) override;  // throws: no context parallelism here

  AeEncoder encoder{nullptr};
  AeDecoder decoder{nullptr};
  AutoencoderOptions options;
  int64_t image_size;
};

// Training FLOPs per sample of the encoder and decoder at `image_size` (3 × forward: convolutions
// and the mid blocks' attention, 2 per multiply-add; norms and activations not counted).
double vae_train_flops_per_sample(const AutoencoderOptions& o, int64_t image_size);

}  // namespace flowtrain::models
