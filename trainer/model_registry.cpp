#include "trainer/model_registry.h"

#include <fmt/format.h>

#include <numeric>
#include <sstream>

namespace flowtrain::trainer {

namespace {

void check_common(const ModelConfig& model) {
  const int64_t hidden = model.resolved_hidden();
  const int64_t heads = model.resolved_heads();
  auto hidden_text = "'model.hidden' (" + std::to_string(hidden) + (model.hidden > 0 ? "" : ", from model.size") + ")";
  if (hidden % heads != 0)
    throw ConfigError(hidden_text + " must be divisible by 'model.heads' (" + std::to_string(heads) +
                      (model.heads > 0 ? "" : ", from model.size") + ")");
  if (model.image_size % model.patch != 0)
    throw ConfigError("'model.image_size' (" + std::to_string(model.image_size) + ") must be divisible by 'model.patch' (" +
                      std::to_string(model.patch) + ")");
  // The patch embedding maps patch² × channels values to the hidden width. Narrower, it has a
  // null space: the noise there is never seen, so never removed, and stays in every sample (a
  // 147 → 128 map on 7×7 RGB patches left 19/147 of the noise: speckle over every canvas).
  const int64_t patch_values = model.patch_t * model.patch * model.patch * model.in_channels;
  if (patch_values > hidden)
    throw ConfigError(fmt::format("{} is narrower than a patch's {} values ('model.patch' {}² × 'model.in_channels' {}): "
                                  "the model could never remove the noise in the other {} dimensions; use a wider "
                                  "model.hidden or a smaller model.patch{}",
                                  hidden_text, patch_values, model.patch, model.in_channels, patch_values - hidden,
                                  model.patch_t > 1 ? fmt::format(" (values also × 'model.patch_t' {})", model.patch_t) : ""));
}

// ---- DiT ------------------------------------------------------------------------------------

ModelPreset dit_preset(const std::string& size) {
  try {
    const models::DiTOptions o = models::dit_size(size);
    return {o.hidden, o.depth, o.heads};
  } catch (const std::invalid_argument&) {
    throw ConfigError(fmt::format("'model.size' '{}' is not a DiT size (one of {})", size,
                                  fmt::join(models::dit_size_names(), "|")));
  }
}

void validate_dit(const ModelConfig& model) {
  check_common(model);
  if (model.resolved_hidden() % 4 != 0)
    throw ConfigError("'model.hidden' (" + std::to_string(model.resolved_hidden()) +
                      ") must be divisible by 4 (the 2-D sin-cos position table splits it in four)");
}

std::shared_ptr<models::DiffusionModel> build_dit(const ModelConfig& model) {
  // Checked here, not in validate_dit: a resolved config may carry every key (the round-trip
  // tests set them all), but a DiT built with frames would silently train on something else.
  if (model.frames != 1)
    throw ConfigError("'model.frames' is " + std::to_string(model.frames) +
                      " but the DiT is an image model: video is model.arch flux with model.frames > 1");
  auto dit = std::make_shared<models::DiTImpl>(dit_options(model));
  dit->class_dropout = model.class_dropout;
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

// ---- Flux -----------------------------------------------------------------------------------

ModelPreset flux_preset(const std::string& size) {
  try {
    const models::FluxOptions o = models::flux_size(size);
    return {o.hidden, o.depth, o.heads};
  } catch (const std::invalid_argument&) {
    throw ConfigError(fmt::format("'model.size' '{}' is not a Flux size (one of {})", size,
                                  fmt::join(models::flux_size_names(), "|")));
  }
}

std::vector<int64_t> parse_axes(const std::string& text) {
  std::vector<int64_t> axes;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      const int64_t v = std::stoll(item, &used);
      if (used != item.size() || v <= 0 || v % 2) throw std::invalid_argument(item);
      axes.push_back(v);
    } catch (const std::exception&) {
      throw ConfigError(fmt::format("'model.axes_dim' must be comma-separated positive even integers "
                                    "(e.g. 16,56,56), got '{}'",
                                    text));
    }
  }
  return axes;
}

void validate_flux(const ModelConfig& model) {
  check_common(model);
  if (model.frames % model.patch_t != 0)
    throw ConfigError(fmt::format("'model.frames' ({}) must be a multiple of 'model.patch_t' ({})", model.frames,
                                  model.patch_t));
  const models::FluxOptions o = flux_options(model);
  const int64_t sum = std::accumulate(o.axes_dim.begin(), o.axes_dim.end(), int64_t{0});
  if (sum != o.head_dim())
    throw ConfigError(fmt::format("'model.axes_dim' ({}{}) must sum to the head dim {} (model.hidden {} / model.heads {})",
                                  fmt::join(o.axes_dim, ","), model.axes_dim.empty() ? ", from model.size" : "",
                                  o.head_dim(), o.hidden, o.heads));
  if (o.axes_dim.size() != 3)
    throw ConfigError(fmt::format("'model.axes_dim' needs one entry per id axis (time/index, row, column): 3, got {}",
                                  o.axes_dim.size()));
  if (model.text_encoder_layers > 0 && o.context_dim % model.text_encoder_heads != 0)
    throw ConfigError(fmt::format("'model.context_dim' ({}, the built-in text encoder's width) must be divisible by "
                                  "'model.text_encoder_heads' ({})",
                                  o.context_dim, model.text_encoder_heads));
}

std::shared_ptr<models::DiffusionModel> build_flux(const ModelConfig& model) {
  auto flux = std::make_shared<models::FluxImpl>(flux_options(model));
  flux->text_dropout = model.text_dropout;
  if (!has_builtin_text_encoder(model)) return flux;  // conditioned on precomputed embeddings
  // The built-in text path: the encoder (built after the transformer, from the same generator) feeds it.
  models::TextEncoder encoder(text_encoder_options(model));
  return std::make_shared<models::TextToImageImpl>(encoder, flux, model.text_dropout);
}

ModelCost flux_cost(const ModelConfig& model) {
  const models::FluxOptions o = flux_options(model);
  ModelCost cost;
  cost.parameters = models::flux_parameter_count(o);
  cost.train_flops_per_sample = 3.0 * models::flux_forward_flops_per_sample(o);
  cost.tokens_per_sample = o.image_tokens() + o.text_len;
  if (has_builtin_text_encoder(model)) {
    const models::TextEncoderOptions t = text_encoder_options(model);
    cost.text_encoder_parameters = models::text_encoder_parameter_count(t);
    cost.parameters += cost.text_encoder_parameters;
    cost.train_flops_per_sample += 3.0 * models::text_encoder_forward_flops_per_sample(t);
  }
  return cost;
}

const std::vector<ModelFamily>& families() {
  static const std::vector<ModelFamily> all = {
      {"dit", models::dit_size_names(), dit_preset, validate_dit, build_dit, dit_cost,
       [](const at::Tensor& labels) { return models::Conditioning{{"labels", labels}}; }},
      {"flux", models::flux_size_names(), flux_preset, validate_flux, build_flux, flux_cost, nullptr},
  };
  return all;
}

}  // namespace

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

models::FluxOptions flux_options(const ModelConfig& m) {
  models::FluxOptions o = models::flux_size(m.size);  // validated by flux_preset first
  o.in_channels = m.in_channels;
  o.patch = m.patch;
  o.input_size = m.image_size;
  o.frames = m.frames;
  o.patch_t = m.patch_t;
  o.hidden = m.resolved_hidden();
  o.depth = m.resolved_depth();
  o.heads = m.resolved_heads();
  if (m.depth_single > 0) o.depth_single = m.depth_single;
  if (m.context_dim > 0) o.context_dim = m.context_dim;
  if (m.vec_dim > 0) o.vec_dim = m.vec_dim;
  if (!m.axes_dim.empty()) o.axes_dim = parse_axes(m.axes_dim);
  o.theta = m.theta;
  o.mlp_ratio = m.mlp_ratio;
  o.text_len = m.text_len;
  return o;
}

models::TextEncoderOptions text_encoder_options(const ModelConfig& m) {
  const models::FluxOptions f = flux_options(m);
  models::TextEncoderOptions o;
  o.vocab_size = m.vocab_size;
  o.length = m.text_len;
  o.width = f.context_dim;
  o.depth = m.text_encoder_layers;
  o.heads = m.text_encoder_heads;
  o.pooled_dim = f.vec_dim;
  return o;
}

bool has_builtin_text_encoder(const ModelConfig& m) { return m.arch == "flux" && m.text_encoder_layers > 0; }

std::vector<std::string> exported_parts(const ModelConfig& m) {
  if (has_builtin_text_encoder(m))
    return {models::TextToImageImpl::kTransformerPrefix, models::TextToImageImpl::kTextEncoderPrefix};
  return {""};
}

std::vector<std::string> model_arch_names() {
  std::vector<std::string> names;
  for (const auto& f : families()) names.push_back(f.arch);
  return names;
}

std::vector<std::string> model_size_names() {
  std::vector<std::string> names;
  for (const auto& f : families()) names.insert(names.end(), f.sizes.begin(), f.sizes.end());
  return names;
}

const ModelFamily& model_family(const std::string& arch) {
  for (const auto& f : families())
    if (f.arch == arch) return f;
  throw ConfigError(fmt::format("'model.arch' must be one of {}, got '{}'", fmt::join(model_arch_names(), "|"), arch));
}

ModelPreset model_preset(const ModelConfig& model) { return model_family(model.arch).preset(model.size); }

std::shared_ptr<models::DiffusionModel> build_model(const ModelConfig& model) {
  return model_family(model.arch).build(model);
}

}  // namespace flowtrain::trainer
