// The Flux family (models/flux/, black-forest-labs/flux's MMDiT): text-conditioned, on
// precomputed text embeddings (T5 tokens + CLIP pooled vector) or through a small text encoder
// trained with it (models/text/); images, or clips with model.frames > 1 (3-D position ids).
#include "data/safetensors.h"
#include "models/flux/flux.h"
#include "models/text/text_to_image.h"
#include "trainer/families/common.h"
#include "trainer/families/flux/flux_config.h"
#include "trainer/family.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <numeric>
#include <sstream>

namespace flowtrain::trainer::families {

namespace {

const FluxConfig& flux_keys(const ModelConfig& m) { return m.family<FluxConfig>(); }

bool has_builtin_text_encoder(const ModelConfig& m) { return flux_keys(m).text_encoder_layers > 0; }

std::vector<int64_t> parse_axes(const std::string& text) {
  return parse_positive_ints(text, "axes_dim", "16,56,56", "even", [](int64_t v) { return v % 2 == 0; });
}

std::vector<Key<ModelConfig>> flux_config_keys() {
  return family_keys<FluxConfig>()
      .add("depth_single", &FluxConfig::depth_single, at_least(0), "single-stream blocks; 0 = from size")
      .add("context_dim", &FluxConfig::context_dim, at_least(0), "text token embedding width; 0 = from size")
      .add("vec_dim", &FluxConfig::vec_dim, at_least(0), "pooled text vector width; 0 = from size")
      .add("axes_dim", &FluxConfig::axes_dim, any_value(), "RoPE channels per id axis, e.g. 16,56,56; empty = from size")
      .add("theta", &FluxConfig::theta, above(0), "RoPE base")
      .add("text_len", &FluxConfig::text_len, at_least(1), "text tokens per sample")
      .add("text_dropout", &FluxConfig::text_dropout, range("[)", 0, 1),
           "probability each text input is zeroed in training (classifier-free guidance)")
      .add("text_encoder_layers", &FluxConfig::text_encoder_layers, at_least(0),
           "layers of the built-in text encoder (trained jointly, reads captions); 0 = precomputed text embeddings "
           "from the data set")
      .add("text_encoder_heads", &FluxConfig::text_encoder_heads, at_least(1),
           "attention heads of the built-in text encoder (must divide context_dim)")
      .add("vocab_size", &FluxConfig::vocab_size, at_least(4),
           "token ids of the built-in text encoder (>= the data set tokenizer's pieces)")
      .add("patch_t", &FluxConfig::patch_t, at_least(1), "video: frames per token; must divide frames")
      .add("guidance", &FluxConfig::guidance, at_least(0),
           "a guidance-distilled model (flux-dev): the guidance value g it is trained and sampled at")
      .keys;
}

models::FluxOptions flux_options(const ModelConfig& m) {
  const FluxConfig& f = flux_keys(m);
  models::FluxOptions o = models::flux_size(m.size);  // validated by flux_preset first
  o.in_channels = m.in_channels;
  o.patch = m.patch;
  o.input_size = m.image_size;
  o.frames = m.frames;
  o.patch_t = f.patch_t;
  o.hidden = m.resolved_hidden();
  o.depth = m.resolved_depth();
  o.heads = m.resolved_heads();
  if (f.depth_single > 0) o.depth_single = f.depth_single;
  if (f.context_dim > 0) o.context_dim = f.context_dim;
  if (f.vec_dim > 0) o.vec_dim = f.vec_dim;
  if (!f.axes_dim.empty()) o.axes_dim = parse_axes(f.axes_dim);
  o.theta = f.theta;
  o.mlp_ratio = m.mlp_ratio;
  o.text_len = f.text_len;
  return o;
}

// The built-in text encoder: width context_dim, pooled width vec_dim, model.text_len positions.
models::TextEncoderOptions text_encoder_options(const ModelConfig& m) {
  const models::FluxOptions f = flux_options(m);
  const FluxConfig& keys = flux_keys(m);
  models::TextEncoderOptions o;
  o.vocab_size = keys.vocab_size;
  o.length = keys.text_len;
  o.width = f.context_dim;
  o.depth = keys.text_encoder_layers;
  o.heads = keys.text_encoder_heads;
  o.pooled_dim = f.vec_dim;
  return o;
}

ModelPreset flux_preset(const std::string& size) {
  return preset_from_options(size, "Flux", [](const std::string& name) { return models::flux_size(name); },
                             models::flux_size_names());
}

void validate_flux(const ModelConfig& model) {
  const FluxConfig& keys = flux_keys(model);
  check_patch_transformer(model, keys.patch_t);
  if (model.frames % keys.patch_t != 0)
    throw ConfigError(fmt::format("'model.frames' ({}) must be a multiple of 'model.patch_t' ({})", model.frames,
                                  keys.patch_t));
  const models::FluxOptions o = flux_options(model);
  const int64_t sum = std::accumulate(o.axes_dim.begin(), o.axes_dim.end(), int64_t{0});
  if (sum != o.head_dim())
    throw ConfigError(fmt::format("'model.axes_dim' ({}{}) must sum to the head dim {} (model.hidden {} / model.heads {})",
                                  fmt::join(o.axes_dim, ","), keys.axes_dim.empty() ? ", from model.size" : "",
                                  o.head_dim(), o.hidden, o.heads));
  if (o.axes_dim.size() != 3)
    throw ConfigError(fmt::format("'model.axes_dim' needs one entry per id axis (time/index, row, column): 3, got {}",
                                  o.axes_dim.size()));
  if (has_builtin_text_encoder(model) && o.context_dim % keys.text_encoder_heads != 0)
    throw ConfigError(fmt::format("'model.context_dim' ({}, the built-in text encoder's width) must be divisible by "
                                  "'model.text_encoder_heads' ({})",
                                  o.context_dim, keys.text_encoder_heads));
}

std::shared_ptr<models::DiffusionModel> build_flux(const ModelConfig& model) {
  auto flux = std::make_shared<models::FluxImpl>(flux_options(model));
  flux->text_dropout = flux_keys(model).text_dropout;
  flux->guidance = flux_keys(model).guidance;
  if (!has_builtin_text_encoder(model)) return flux;  // conditioned on precomputed embeddings
  // The built-in text path: the encoder (built after the transformer, from the same generator) feeds it.
  models::TextEncoder encoder(text_encoder_options(model));
  return std::make_shared<models::TextToImageImpl>(encoder, flux, flux_keys(model).text_dropout);
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

std::vector<models::UnitFootprint> flux_footprint(const ModelConfig& model, bool cpu_fp32) {
  const models::FluxOptions o = flux_options(model);
  auto units = models::flux_unit_footprints(o, models::default_attention_saves(cpu_fp32, o.image_tokens() + o.text_len));
  if (has_builtin_text_encoder(model)) {  // the built-in text encoder is part of the stem unit
    const models::TextEncoderOptions t = text_encoder_options(model);
    units.front().parameters += models::text_encoder_parameter_count(t);
    units.front().saved += models::text_encoder_saved_per_sample(t);
  }
  return units;
}

TextConditioning flux_text(const ModelConfig& model) {
  const models::FluxOptions o = flux_options(model);
  TextConditioning text;
  text.input = has_builtin_text_encoder(model) ? TextInput::Tokens : TextInput::Embeddings;
  text.length = o.text_len;
  text.vocab_size = text.input == TextInput::Tokens ? flux_keys(model).vocab_size : 0;
  text.width = o.context_dim;
  text.pooled_width = o.vec_dim;
  return text;
}

std::vector<std::string> flux_exported_parts(const ModelConfig& model) {
  // With the built-in text encoder the transformer is its own file, so that file carries the
  // reference key names.
  if (has_builtin_text_encoder(model))
    return {models::TextToImageImpl::kTransformerPrefix, models::TextToImageImpl::kTextEncoderPrefix};
  return {""};
}

std::map<std::string, std::string> flux_reference_metadata(const ModelConfig& model) {
  const models::FluxOptions o = flux_options(model);
  if (!has_builtin_text_encoder(model) || o.guidance_embed)
    throw ConfigError("--parity-dump: bench/pytorch_peer.py implements Flux with the built-in text encoder "
                      "(model.text_encoder_layers > 0) and no guidance embedding");
  return {{"depth_single", std::to_string(o.depth_single)},
          {"context_dim", std::to_string(o.context_dim)},
          {"vec_dim", std::to_string(o.vec_dim)},
          {"axes_dim", fmt::format("{}", fmt::join(o.axes_dim, ","))},
          {"theta", fmt::format("{}", o.theta)},
          {"guidance_embed", o.guidance_embed ? "true" : "false"},
          {"text_len", std::to_string(o.text_len)},
          {"text_encoder_layers", std::to_string(flux_keys(model).text_encoder_layers)},
          {"text_encoder_heads", std::to_string(flux_keys(model).text_encoder_heads)},
          {"vocab_size", std::to_string(flux_keys(model).vocab_size)},
          {"text_dropout", fmt::format("{}", flux_keys(model).text_dropout)}};
}

// The inputs of the reference forward (black-forest-labs/flux Flux.forward) at the first
// sampling step of `cond`'s rows (their conditional branch).
void dump_flux_inputs(const std::string& path, models::DiffusionModel& model, const at::Tensor& noise,
                      const models::Conditioning& cond, const models::SamplerOptions& so) {
  models::Conditioning inner = cond;
  models::DiffusionModel* transformer = &model;
  if (auto* t2i = dynamic_cast<models::TextToImageImpl*>(&model)) {
    inner = t2i->encode(cond);
    transformer = t2i->transformer.get();
  }
  auto* flux = dynamic_cast<models::FluxImpl*>(transformer);
  if (!flux) throw std::logic_error("dump_flux_inputs: the model is not a Flux model");
  const auto& o = flux->options;
  if (o.is_video())
    throw ConfigError("--dump-inputs writes the reference Flux forward's inputs, an image model's: model.frames must be 1");
  const int64_t B = noise.size(0), h = noise.size(2) / o.patch, w = noise.size(3) / o.patch;
  const at::Tensor& txt = inner.at("txt");
  const at::Tensor t0 = models::sampling_times(so.steps, so.shift)[0];
  data::NamedTensors inputs = {{"img", models::pack_latents(noise, o.patch).contiguous()},
                               {"img_ids", models::image_ids(B, h, w, noise.options()).contiguous()},
                               {"txt", txt.contiguous()},
                               {"txt_ids", at::zeros({B, txt.size(1), 3}, txt.options().dtype(at::kFloat))},
                               {"y", inner.at("vec").contiguous()},
                               {"timesteps", t0.expand({B}).to(at::kFloat).contiguous()}};
  if (o.guidance_embed) inputs.emplace_back("guidance", flux->guidance_input(inner, B, noise.options()).contiguous());
  for (auto& [name, t] : inputs) t = t.to(at::kCPU, at::kFloat);  // the reference's dtype, whatever autocast made
  data::write_safetensors(path, inputs, {{"cfg_scale", std::to_string(so.cfg_scale)}, {"steps", std::to_string(so.steps)}});
  spdlog::info("wrote the first sampling step's inputs to {}", path);
}

}  // namespace

FamilySpec flux_family() {
  FamilySpec spec;
  spec.arch = "flux";
  spec.sizes = models::flux_size_names();
  spec.preset = flux_preset;
  spec.keys = flux_config_keys();
  spec.validate = validate_flux;
  spec.build = build_flux;
  spec.cost = flux_cost;
  spec.footprint = flux_footprint;
  spec.image_tokens = [](const ModelConfig& model) { return flux_options(model).image_tokens(); };
  spec.text_conditioning = flux_text;
  spec.variable_resolution = true;  // position ids follow each batch's shape
  spec.exported_parts = flux_exported_parts;
  spec.reference_metadata = flux_reference_metadata;
  spec.dump_reference_inputs = dump_flux_inputs;
  spec.parallelize = parallelize_transformer;
  return spec;
}

}  // namespace flowtrain::trainer::families
