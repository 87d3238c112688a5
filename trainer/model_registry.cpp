#include "trainer/model_registry.h"

#include <fmt/format.h>

namespace flowtrain::trainer {

models::DiTOptions dit_options(const ModelConfig& m) {
  models::DiTOptions o;
  o.input_size = m.image_size;
  o.patch = m.patch;
  o.in_channels = m.in_channels;
  o.hidden = m.resolved_hidden();
  o.depth = m.resolved_depth();
  o.heads = m.resolved_heads();
  o.mlp_ratio = m.mlp_ratio;
  o.num_classes = m.num_classes;
  o.learn_sigma = m.learn_sigma;
  return o;
}

namespace {

void validate_dit(const ModelConfig& model) {
  const int64_t hidden = model.resolved_hidden();
  const int64_t heads = model.resolved_heads();
  auto hidden_text = "'model.hidden' (" + std::to_string(hidden) + (model.hidden > 0 ? "" : ", from model.size") + ")";
  if (hidden % heads != 0)
    throw ConfigError(hidden_text + " must be divisible by 'model.heads' (" + std::to_string(heads) +
                      (model.heads > 0 ? "" : ", from model.size") + ")");
  if (hidden % 4 != 0)
    throw ConfigError(hidden_text + " must be divisible by 4 (the 2-D sin-cos position table splits it in four)");
  if (model.image_size % model.patch != 0)
    throw ConfigError("'model.image_size' (" + std::to_string(model.image_size) + ") must be divisible by 'model.patch' (" +
                      std::to_string(model.patch) + ")");
}

std::shared_ptr<models::DiffusionModel> build_dit(const ModelConfig& model) {
  auto dit = std::make_shared<models::DiTImpl>(dit_options(model));
  dit->class_dropout = model.class_dropout;
  return dit;
}

const std::vector<ModelFamily>& families() {
  static const std::vector<ModelFamily> all = {
      {"dit", validate_dit, build_dit,
       [](const at::Tensor& labels) { return models::Conditioning{{"labels", labels}}; }},
  };
  return all;
}

}  // namespace

std::vector<std::string> model_arch_names() {
  std::vector<std::string> names;
  for (const auto& f : families()) names.push_back(f.arch);
  return names;
}

const ModelFamily& model_family(const std::string& arch) {
  for (const auto& f : families())
    if (f.arch == arch) return f;
  throw ConfigError(fmt::format("'model.arch' must be one of {}, got '{}'", fmt::join(model_arch_names(), "|"), arch));
}

std::shared_ptr<models::DiffusionModel> build_model(const ModelConfig& model) {
  return model_family(model.arch).build(model);
}

}  // namespace flowtrain::trainer
