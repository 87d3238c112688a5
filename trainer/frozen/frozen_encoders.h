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

// The two tokenizers of FLUX's text path, without the models: data workers tokenize captions with
// them (const and thread-safe) and the step runs the encoders on the ids.
class FrozenTokenizers {
 public:
  // model.text_encoders.*: the tokenizers' files, and CLIP's context length from its config.json.
  explicit FrozenTokenizers(const ModelConfig& model);
  struct Tokens {
    at::Tensor t5_ids;    // int64 [B, t5_max_length], padded with 0
    at::Tensor t5_mask;   // bool [B, t5_max_length]: the caption's tokens and its end id
    at::Tensor clip_ids;  // int64 [B, clip context], padded with the end id
    std::vector<int64_t> truncated;  // rows whose caption T5's max_length cut
  };
  Tokens tokenize(const std::vector<std::string>& captions) const;

 private:
  data::T5Tokenizer t5_;
  data::ClipTokenizer clip_;
  int64_t t5_max_length_ = 512, clip_length_ = 77;
};

class FrozenEncoders {
 public:
  // Loads what the model section names; throws DataError / CheckpointError naming a file that
  // does not load.
  FrozenEncoders(const ModelConfig& model, at::Device device, at::ScalarType dtype);

  bool has_autoencoder() const { return autoencoder_.has_value(); }
  bool has_text_encoders() const { return t5_.has_value() && clip_.has_value(); }
  const models::AutoencoderOptions& autoencoder_options() const;
  int64_t downsampling() const;  // pixels per latent cell: 2^(levels - 1)

  // Outputs are float32 on the encoders' device (the caller moves them where it needs them).
  // float [B, 3, H, W] in [-1, 1] -> the scaled latent mean [B, z, H/f, W/f].
  at::Tensor encode_images(const at::Tensor& images);
  // A scaled latent -> images [B, 3, H, W] in about [-1, 1].
  at::Tensor decode_latents(const at::Tensor& latents);

  struct Text {
    at::Tensor txt;       // float32 [B, t5_max_length, d_model]
    at::Tensor txt_mask;  // bool [B, t5_max_length]: the caption's tokens and its end id
    at::Tensor vec;       // float32 [B, clip hidden]
    std::vector<int64_t> truncated;  // rows whose caption T5's max_length cut
  };
  Text encode_text(const std::vector<std::string>& captions);
  Text encode_tokens(const FrozenTokenizers::Tokens& tokens);

 private:
  at::Device device_;
  at::ScalarType dtype_;
  std::optional<models::Autoencoder> autoencoder_;
  std::optional<models::T5Encoder> t5_;
  std::optional<models::ClipTextEncoder> clip_;
  std::optional<FrozenTokenizers> tokenizers_;
};

// One FrozenEncoders per process for (these files, device), built on first use and kept: the
// training step, sample grids and evaluations share it. bf16 on CUDA, fp32 on the CPU.
FrozenEncoders& shared_frozen_encoders(const ModelConfig& model, const c10::Device& device);

}  // namespace flowtrain::trainer
