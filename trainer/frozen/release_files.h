// Writing frozen models as a FLUX.1 release holds them: ae.safetensors (the autoencoder, its
// options as metadata so that a narrower one than FLUX.1's reads back as itself), and a
// transformers folder (config.json + model.safetensors) for T5 and for CLIP — the files
// trainer/frozen/frozen_models.h reads. `flowtrain export --component` writes through these, the
// tests write small releases with them, and flowtrain_random_release (bench/) a FLUX.1-size one
// with random weights for the GPU check, where the official files cannot be fetched.
#pragma once

#include "models/autoencoder/autoencoder.h"
#include "models/clip/clip.h"
#include "models/t5/t5.h"

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace flowtrain::trainer {

// Each returns the tensor names written, in `dtype`.
std::vector<std::string> write_autoencoder_file(const models::AutoencoderImpl& ae, const std::string& path,
                                                at::ScalarType dtype = at::kFloat);
// The weights of a transformers model folder: model.safetensors as save_pretrained writes it.
std::vector<std::string> write_t5_weights(const models::T5EncoderImpl& t5, const std::string& path,
                                          at::ScalarType dtype = at::kFloat);
std::vector<std::string> write_clip_weights(const models::ClipTextEncoderImpl& clip, const std::string& path,
                                            at::ScalarType dtype = at::kFloat);
// A whole folder: config.json (transformers' keys, the v1.1 gated-GELU T5 / quick-GELU CLIP) and
// model.safetensors. Creates the folder.
void write_t5_folder(const models::T5EncoderImpl& t5, const std::string& folder, at::ScalarType dtype = at::kFloat);
void write_clip_folder(const models::ClipTextEncoderImpl& clip, const std::string& folder,
                       at::ScalarType dtype = at::kFloat);

}  // namespace flowtrain::trainer
