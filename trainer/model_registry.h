// The model families the trainer can build, one entry per `model.arch`. A family is a folder
// under models/ (its network, deriving models::DiffusionModel) plus its entry here: the checks of
// its config section, how it is built from it, and what of a batch conditions it. Nothing else in
// the trainer names a concrete model: train states, FSDP, EMA, checkpoints, sampling, eval and
// bench speak to models::DiffusionModel.
#pragma once

#include "models/dit/dit.h"
#include "models/model.h"
#include "trainer/config/config.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace flowtrain::trainer {

struct ModelFamily {
  std::string arch;  // the model.arch value
  // Cross-field checks of the model section beyond the schema's per-key ranges; throws
  // ConfigError naming the keys.
  std::function<void(const ModelConfig&)> validate;
  std::function<std::shared_ptr<models::DiffusionModel>(const ModelConfig&)> build;
  // The conditioning of samples of class `labels` (int64 [B]): training batches of a labelled
  // data set, sample grids and the class-conditional evaluation.
  std::function<models::Conditioning(const at::Tensor& labels)> class_conditioning;
};

// The family of model.arch; throws ConfigError listing the known ones.
const ModelFamily& model_family(const std::string& arch);
std::vector<std::string> model_arch_names();

// model_family(model.arch).build(model): the network with its reference initialisation, drawn
// from the global CPU generator (seed it first for identical weights on every rank).
std::shared_ptr<models::DiffusionModel> build_model(const ModelConfig& model);

// The DiT family's options from the model section (sizes resolved).
models::DiTOptions dit_options(const ModelConfig& model);

}  // namespace flowtrain::trainer
