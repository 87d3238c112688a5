// The DiT family (models/dit/): class-conditional, fixed-resolution image transformer.
#include "models/dit/dit.h"
#include "trainer/families/common.h"
#include "trainer/families/dit/dit_config.h"
#include "trainer/family.h"

#include <fmt/format.h>

namespace flowtrain::trainer::families {

namespace {

models::DiTOptions dit_options(const ModelConfig& m) {
  models::DiTOptions o;
  o.input_size = m.image_size;
  o.patch = m.patch;
  o.in_channels = m.in_channels;
  o.hidden = m.resolved_hidden();
  o.depth = m.resolved_depth();
  o.heads = m.resolved_heads();
  o.mlp_ratio = m.mlp_ratio;
  o.num_classes = m.family<DiTConfig>().num_classes;
  o.learn_sigma = m.family<DiTConfig>().learn_sigma;
  return o;
}

ModelPreset dit_preset(const std::string& size) {
  return preset_from_options(size, "DiT", [](const std::string& name) { return models::dit_size(name); },
                             models::dit_size_names());
}

std::vector<Key<ModelConfig>> dit_keys() {
  return family_keys<DiTConfig>()
      .add("num_classes", &DiTConfig::num_classes, at_least(1), "class labels (plus one null class)")
      .add("class_dropout", &DiTConfig::class_dropout, range("[)", 0, 1),
           "probability a label is replaced by the null class")
      .add("learn_sigma", &DiTConfig::learn_sigma, any_value(), "output 2*C channels like the original DiT")
      .keys;
}

void validate_dit(const ModelConfig& model) {
  check_patch_transformer(model);
  if (model.resolved_hidden() % 4 != 0)
    throw ConfigError("'model.hidden' (" + std::to_string(model.resolved_hidden()) +
                      ") must be divisible by 4 (the 2-D sin-cos position table splits it in four)");
  if (model.frames != 1)
    throw ConfigError("'model.frames' is " + std::to_string(model.frames) +
                      " but the DiT is an image model: video is model.arch flux with model.frames > 1");
}

std::shared_ptr<models::DiffusionModel> build_dit(const ModelConfig& model) {
  auto dit = std::make_shared<models::DiTImpl>(dit_options(model));
  dit->class_dropout = model.family<DiTConfig>().class_dropout;
  return dit;
}

ModelCost dit_cost(const ModelConfig& model) {
  const models::DiTOptions o = dit_options(model);
  const models::DiTImpl dit(o);  // DiT's sizes fit a machine (XL/2: 675M parameters)
  ModelCost cost;
  cost.parameters = models::count_parameters(dit);
  cost.train_flops_per_sample = models::dit_train_flops_per_sample(o);
  cost.tokens_per_sample = o.num_tokens();
  return cost;
}

std::vector<models::UnitFootprint> dit_footprint(const ModelConfig& model, bool cpu_fp32) {
  return models::dit_unit_footprints(dit_options(model), cpu_fp32);
}

std::map<std::string, std::string> dit_reference_metadata(const ModelConfig& model) {
  const models::DiTOptions o = dit_options(model);
  return {{"num_classes", std::to_string(o.num_classes)},
          {"class_dropout", fmt::format("{}", model.family<DiTConfig>().class_dropout)},
          {"learn_sigma", o.learn_sigma ? "true" : "false"},
          {"timestep_scale", fmt::format("{}", o.timestep_scale)}};
}

}  // namespace

FamilySpec dit_family() {
  FamilySpec spec;
  spec.arch = "dit";
  spec.sizes = models::dit_size_names();
  spec.preset = dit_preset;
  spec.keys = dit_keys();
  spec.validate = validate_dit;
  spec.build = build_dit;
  spec.cost = dit_cost;
  spec.footprint = dit_footprint;
  spec.image_tokens = [](const ModelConfig& model) { return dit_options(model).num_tokens(); };
  spec.class_conditioning = [](const at::Tensor& labels) { return models::Conditioning{{"labels", labels}}; };
  spec.classes = [](const ModelConfig& model) { return model.family<DiTConfig>().num_classes; };
  spec.reference_metadata = dit_reference_metadata;
  spec.parallelize = parallelize_transformer;
  return spec;
}

}  // namespace flowtrain::trainer::families
