// The FLUX stack's frozen encoders run together, as FLUX.1's own code prepares a batch
// (flux/sampling.py prepare, flux/modules/conditioner.py): images through the autoencoder to
// scaled latents, captions through T5 (max_length tokens padded with 0, no attention mask: FLUX
// attends to the padding) to `txt` [B, L, d_model], and through CLIP (77 tokens padded with the end
// id) to the pooled `vec` [B, hidden]. The files come from the config's model.autoencoder and
// model.text_encoders.* (trainer/frozen/frozen_models.h). Everything under no_grad.
#pragma once

#include "data/clip_tokenizer.h"
#include "data/t5_tokenizer.h"
#include "models/autoencoder/autoencoder.h"
#include "models/clip/clip.h"
#include "models/t5/t5.h"
#include "trainer/config/config.h"

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

namespace flowtrain::trainer {

class FrozenEncoders {
 public:
  // Loads what the model section names; throws DataError / CheckpointError naming a file that
  // does not load.
  FrozenEncoders(const ModelConfig& model, at::Device device, at::ScalarType dtype);

  bool has_autoencoder() const { return autoencoder_.has_value(); }
  bool has_text_encoders() const { return t5_.has_value() && clip_.has_value(); }
  const models::AutoencoderOptions& autoencoder_options() const;
  int64_t downsampling() const;  // pixels per latent cell: 2^(levels - 1)

  // float [B, 3, H, W] in [-1, 1] -> the scaled latent mean [B, z, H/f, W/f], float32 on the CPU.
  at::Tensor encode_images(const at::Tensor& images);
  // A scaled latent -> images [B, 3, H, W] in about [-1, 1], float32 on the CPU.
  at::Tensor decode_latents(const at::Tensor& latents);

  struct Text {
    at::Tensor txt;       // float32 [B, t5_max_length, d_model]
    at::Tensor txt_mask;  // bool [B, t5_max_length]: the caption's tokens and its end id
    at::Tensor vec;       // float32 [B, clip hidden]
    std::vector<int64_t> truncated;  // rows whose caption T5's max_length cut
  };
  Text encode_text(const std::vector<std::string>& captions);

 private:
  at::Device device_;
  at::ScalarType dtype_;
  int64_t t5_max_length_ = 512;
  std::optional<models::Autoencoder> autoencoder_;
  std::optional<models::T5Encoder> t5_;
  std::optional<models::ClipTextEncoder> clip_;
  std::optional<data::T5Tokenizer> t5_tokenizer_;
  std::optional<data::ClipTokenizer> clip_tokenizer_;
};

}  // namespace flowtrain::trainer
