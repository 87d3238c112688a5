// What sampling needs of the frozen FLUX stack, once per process:
//   - prompts through the frozen text encoders (model.text_encoders.*) as the `txt` / `vec` /
//     `txt_mask` a model on precomputed embeddings was trained on;
//   - samples of a latent model (model.autoencoder set: latents precomputed or encoded in the
//     step) through the frozen autoencoder's decoder, so grids, `flowtrain sample` and
//     `flowtrain eval` see pixels.
// The models load on first use (the sampling device: the run's), and stay loaded.
#pragma once

#include "models/conditioning.h"
#include "trainer/config/config.h"

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace flowtrain::trainer {

// Whether the config names both frozen text encoders (prompts can then be encoded).
bool has_frozen_text_encoders(const ModelConfig& model);
models::Conditioning frozen_prompt_conditioning(const Config& config, const std::vector<std::string>& prompts);

// Whether samples of this run are latents to decode (model.autoencoder is set).
bool decodes_samples(const Config& config);
// Samples in the model's space -> images in about [−1, 1] on the CPU: decoded when
// decodes_samples(config), else as they are.
at::Tensor samples_to_pixels(const Config& config, const at::Tensor& samples);
// The shape of one sample as pixels: the model's sample_shape(), or, when decodes_samples(config),
// the autoencoder's output channels and f× the side (f: its downsampling; reads the file's header).
std::vector<int64_t> pixel_sample_shape(const Config& config, std::vector<int64_t> model_shape);
// The inverse, for held-out images: pixels in [−1, 1] -> the model's space (the autoencoder's
// scaled latent means when decodes_samples(config), else as they are), float32 on the CPU.
at::Tensor pixels_to_model_space(const Config& config, const at::Tensor& pixels);

}  // namespace flowtrain::trainer
