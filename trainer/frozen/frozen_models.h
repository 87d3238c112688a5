// The frozen models of the FLUX stack built from the files a release ships, as they are:
//   autoencoder  ae.safetensors (FLUX.1's top level): the architecture read from the tensors'
//                shapes; norm groups, scale and shift factor from the file's metadata where
//                flowtrain wrote them, FLUX.1's otherwise
//   T5           a folder with transformers' config.json and model.safetensors or a sharded
//                model.safetensors.index.json (FLUX.1's text_encoder_2/)
//   CLIP         a folder with config.json and model.safetensors (FLUX.1's text_encoder/)
// Weights load strictly (trainer::load_weights_file: every missing, unexpected or mis-shaped key
// named in one error). Frozen: parameters without gradients, eval mode, on `device` in `dtype`
// (bf16 on CUDA, fp32 on the CPU, by the caller's choice).
#pragma once

#include "models/autoencoder/autoencoder.h"
#include "models/clip/clip.h"
#include "models/t5/t5.h"

#include <ATen/ATen.h>

#include <string>

namespace flowtrain::trainer {

// The component names `flowtrain export --component` and the config use.
enum class FrozenComponent { autoencoder, t5, clip };
FrozenComponent frozen_component(const std::string& name);  // throws std::invalid_argument listing them

models::AutoencoderOptions autoencoder_options_of_file(const std::string& path);
models::T5Options t5_options_of_config(const std::string& config_json);
models::ClipTextOptions clip_options_of_config(const std::string& config_json);
// A release folder's weights: model.safetensors.index.json when there, else model.safetensors.
std::string weights_in_folder(const std::string& folder);

models::Autoencoder load_autoencoder(const std::string& path, at::Device device = at::kCPU,
                                     at::ScalarType dtype = at::kFloat);
models::T5Encoder load_t5(const std::string& folder, at::Device device = at::kCPU, at::ScalarType dtype = at::kFloat);
models::ClipTextEncoder load_clip(const std::string& folder, at::Device device = at::kCPU,
                                  at::ScalarType dtype = at::kFloat);

// `flowtrain export --component`: the component loaded from `source` written back to `out` as the
// release holds it (the autoencoder as ae.safetensors with its options as metadata; T5 as
// save_pretrained writes model.safetensors; CLIP under `text_model.`), fp32 or bf16. Returns the
// tensor names written.
std::vector<std::string> export_component(FrozenComponent component, const std::string& source, const std::string& out,
                                          at::ScalarType dtype = at::kFloat);

}  // namespace flowtrain::trainer
