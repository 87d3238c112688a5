// The model families the trainer can build, one entry per `model.arch`. A family is a folder
// under models/ (its network, deriving models::DiffusionModel) plus its entry here: its size
// presets, the checks of its config section, how it is built, its size and cost without building
// it, and what of a batch conditions it. Nothing else in the trainer names a concrete model:
// train states, FSDP, EMA, checkpoints, sampling, eval and bench speak to models::DiffusionModel.
#pragma once

#include "models/dit/dit.h"
#include "models/flux/flux.h"
#include "models/model.h"
#include "models/text/text_to_image.h"
#include "trainer/config/config.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace flowtrain::trainer {

// What a size name sets (0 where the family has no such dimension).
struct ModelPreset {
  int64_t hidden = 0, depth = 0, heads = 0;
};

// Size and cost from the config alone: `flowtrain config` reports them for models far larger than
// the machine (flux-dev: 11.9B parameters) without building one.
struct ModelCost {
  int64_t parameters = 0;              // all of them, a built-in text encoder's included
  int64_t text_encoder_parameters = 0;  // of those, the built-in text encoder's
  double train_flops_per_sample = 0;  // 3 × forward
  int64_t tokens_per_sample = 0;
};

struct ModelFamily {
  std::string arch;  // the model.arch value
  std::vector<std::string> sizes;
  std::function<ModelPreset(const std::string& size)> preset;  // throws ConfigError for a foreign size
  // Cross-field checks of the model section beyond the schema's per-key ranges; throws
  // ConfigError naming the keys.
  std::function<void(const ModelConfig&)> validate;
  std::function<std::shared_ptr<models::DiffusionModel>(const ModelConfig&)> build;
  std::function<ModelCost(const ModelConfig&)> cost;
  // The conditioning of samples of class `labels` (int64 [B]): training batches of a labelled
  // data set, sample grids and the class-conditional evaluation. Empty for a family conditioned
  // on text (trainer/run_conditioning.h: captions or text embeddings from the data).
  using ClassConditioning = std::function<models::Conditioning(const at::Tensor& labels)>;
  ClassConditioning class_conditioning;
};

// The parts of a model's state that `flowtrain export` writes as files of their own, as the
// module-name prefixes removed from the keys: {""} is one file with the names as they are; a flux
// model with the built-in text encoder has {"transformer.", "text_encoder."}, so its first file
// carries the reference key names. `train --init-from FILE` loads FILE into the first part.
std::vector<std::string> exported_parts(const ModelConfig& model);

// The family of model.arch; throws ConfigError listing the known ones.
const ModelFamily& model_family(const std::string& arch);
std::vector<std::string> model_arch_names();
std::vector<std::string> model_size_names();  // every family's, for the schema
ModelPreset model_preset(const ModelConfig& model);  // the family's preset of model.size

// model_family(model.arch).build(model): the network with its initialisation, drawn from the
// global CPU generator (seed it first for identical weights on every rank).
std::shared_ptr<models::DiffusionModel> build_model(const ModelConfig& model);

// The families' options from the model section (sizes resolved).
models::DiTOptions dit_options(const ModelConfig& model);
models::FluxOptions flux_options(const ModelConfig& model);
// Whether the model reads captions through its own text encoder (flux with
// model.text_encoder_layers > 0) rather than precomputed embeddings or class labels.
bool has_builtin_text_encoder(const ModelConfig& model);
// The built-in text encoder of such a model: width
// context_dim, pooled width vec_dim, model.text_len positions.
models::TextEncoderOptions text_encoder_options(const ModelConfig& model);

}  // namespace flowtrain::trainer
