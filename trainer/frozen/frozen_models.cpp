#include "trainer/frozen/frozen_models.h"

#include "data/data_error.h"
#include "data/safetensors.h"
#include "data/weight_files.h"
#include "trainer/checkpoint/state_dict.h"
#include "trainer/frozen/release_files.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace flowtrain::trainer {
namespace fs = std::filesystem;
namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw data::DataError(path + ": cannot open");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw data::DataError(path + ": not JSON (" + e.what() + ")");
  }
}

// config[key] as T; a missing key takes `fallback` when given, else is an error naming the file.
template <class T>
T json_value(const nlohmann::json& config, const std::string& key, const std::string& path,
             const std::optional<T>& fallback = std::nullopt) {
  if (!config.contains(key) || config[key].is_null()) {
    if (fallback) return *fallback;
    throw data::DataError(path + ": has no '" + key + "'");
  }
  try {
    return config[key].get<T>();
  } catch (const nlohmann::json::exception&) {
    throw data::DataError(path + ": '" + key + "' is " + config[key].dump() + ", not a value of the expected type");
  }
}

std::vector<int64_t> shape_of(const data::WeightFiles& files, const std::string& key) {
  if (!files.contains(key))
    throw data::DataError(files.path() + ": no '" + key + "': not an autoencoder of FLUX.1's layout (ae.safetensors)");
  return files.shape(key);
}

template <class Module>
void freeze(Module& module, at::Device device, at::ScalarType dtype) {
  module->to(device, dtype);
  module->eval();
  for (auto& p : module->parameters()) p.set_requires_grad(false);
}

std::string metadata_value(const std::map<std::string, std::string>& metadata, const std::string& key,
                           const std::string& fallback) {
  const auto it = metadata.find(key);
  return it == metadata.end() ? fallback : it->second;
}

}  // namespace

FrozenComponent frozen_component(const std::string& name) {
  if (name == "autoencoder") return FrozenComponent::autoencoder;
  if (name == "t5") return FrozenComponent::t5;
  if (name == "clip") return FrozenComponent::clip;
  throw std::invalid_argument("unknown component '" + name + "' (autoencoder | t5 | clip)");
}

models::AutoencoderOptions autoencoder_options_of_file(const std::string& path) {
  const data::WeightFiles files(path);
  models::AutoencoderOptions o = models::flux_autoencoder_options();
  const std::vector<int64_t> conv_in = shape_of(files, "encoder.conv_in.weight");  // [ch, in, 3, 3]
  o.ch = conv_in[0];
  o.in_channels = conv_in[1];
  o.out_channels = shape_of(files, "decoder.conv_out.weight")[0];
  o.z_channels = shape_of(files, "decoder.conv_in.weight")[1];
  o.ch_mult.clear();
  for (int64_t level = 0; files.contains("encoder.down." + std::to_string(level) + ".block.0.conv2.weight"); ++level) {
    const int64_t width = files.shape("encoder.down." + std::to_string(level) + ".block.0.conv2.weight")[0];
    if (width % o.ch != 0) throw data::DataError(path + ": level " + std::to_string(level) + "'s width " +
                                                 std::to_string(width) + " is not a multiple of ch " + std::to_string(o.ch));
    o.ch_mult.push_back(width / o.ch);
  }
  if (o.ch_mult.empty()) shape_of(files, "encoder.down.0.block.0.conv2.weight");  // throws naming the key
  o.num_res_blocks = 0;
  while (files.contains("encoder.down.0.block." + std::to_string(o.num_res_blocks) + ".conv1.weight")) ++o.num_res_blocks;
  // Not in the tensors: flowtrain writes them as metadata; a FLUX.1 file has FLUX.1's.
  const auto& metadata = files.metadata();
  try {
    o.norm_groups = std::stoll(metadata_value(metadata, "norm_groups", std::to_string(o.norm_groups)));
    o.scale_factor = std::stod(metadata_value(metadata, "scale_factor", std::to_string(o.scale_factor)));
    o.shift_factor = std::stod(metadata_value(metadata, "shift_factor", std::to_string(o.shift_factor)));
  } catch (const std::logic_error&) {
    throw data::DataError(path + ": metadata norm_groups/scale_factor/shift_factor is not a number");
  }
  return o;
}

models::T5Options t5_options_of_config(const std::string& path) {
  const nlohmann::json c = read_json(path);
  const std::string ffn = json_value<std::string>(c, "feed_forward_proj", path, std::string("relu"));
  if (ffn != "gated-gelu")
    throw data::DataError(path + ": feed_forward_proj is '" + ffn + "'; flowtrain's T5 is v1.1's gated-gelu encoder");
  models::T5Options o;
  o.vocab_size = json_value<int64_t>(c, "vocab_size", path);
  o.d_model = json_value<int64_t>(c, "d_model", path);
  o.d_kv = json_value<int64_t>(c, "d_kv", path);
  o.d_ff = json_value<int64_t>(c, "d_ff", path);
  o.num_layers = json_value<int64_t>(c, "num_layers", path);
  o.num_heads = json_value<int64_t>(c, "num_heads", path);
  o.relative_attention_num_buckets = json_value<int64_t>(c, "relative_attention_num_buckets", path, int64_t{32});
  o.relative_attention_max_distance = json_value<int64_t>(c, "relative_attention_max_distance", path, int64_t{128});
  o.layer_norm_eps = json_value<double>(c, "layer_norm_epsilon", path, 1e-6);
  return o;
}

models::ClipTextOptions clip_options_of_config(const std::string& path) {
  nlohmann::json c = read_json(path);
  if (c.contains("text_config") && c["text_config"].is_object()) c = c["text_config"];  // a whole CLIPModel's config
  const std::string act = json_value<std::string>(c, "hidden_act", path, std::string("quick_gelu"));
  if (act != "quick_gelu")
    throw data::DataError(path + ": hidden_act is '" + act + "'; flowtrain's CLIP text encoder is quick_gelu's");
  models::ClipTextOptions o;
  o.vocab_size = json_value<int64_t>(c, "vocab_size", path);
  o.hidden = json_value<int64_t>(c, "hidden_size", path);
  o.intermediate = json_value<int64_t>(c, "intermediate_size", path);
  o.layers = json_value<int64_t>(c, "num_hidden_layers", path);
  o.heads = json_value<int64_t>(c, "num_attention_heads", path);
  o.max_positions = json_value<int64_t>(c, "max_position_embeddings", path);
  o.layer_norm_eps = json_value<double>(c, "layer_norm_eps", path, 1e-5);
  o.eos_token_id = json_value<int64_t>(c, "eos_token_id", path, int64_t{2});
  return o;
}

std::string weights_in_folder(const std::string& folder) {
  if (!fs::is_directory(folder)) throw data::DataError(folder + ": not a folder (a release's config.json + weights)");
  for (const char* name : {"model.safetensors.index.json", "model.safetensors"})
    if (fs::exists(fs::path(folder) / name)) return (fs::path(folder) / name).string();
  throw data::DataError(folder + ": holds neither model.safetensors.index.json nor model.safetensors");
}

models::Autoencoder load_autoencoder(const std::string& path, at::Device device, at::ScalarType dtype) {
  models::Autoencoder ae(autoencoder_options_of_file(path));
  load_weights_file(*ae, path, "");
  freeze(ae, device, dtype);
  return ae;
}

models::T5Encoder load_t5(const std::string& folder, at::Device device, at::ScalarType dtype) {
  models::T5Encoder t5(t5_options_of_config((fs::path(folder) / "config.json").string()));
  load_weights_file(*t5, weights_in_folder(folder), "", {{models::kT5TiedEmbedding, "shared.weight"}});
  freeze(t5, device, dtype);
  return t5;
}

models::ClipTextEncoder load_clip(const std::string& folder, at::Device device, at::ScalarType dtype) {
  models::ClipTextEncoder clip(clip_options_of_config((fs::path(folder) / "config.json").string()));
  load_weights_file(*clip, weights_in_folder(folder), "");
  freeze(clip, device, dtype);
  return clip;
}

std::vector<std::string> export_component(FrozenComponent component, const std::string& source, const std::string& out,
                                          at::ScalarType dtype) {
  switch (component) {
    case FrozenComponent::autoencoder: return write_autoencoder_file(*load_autoencoder(source), out, dtype);
    case FrozenComponent::t5: return write_t5_weights(*load_t5(source), out, dtype);
    case FrozenComponent::clip: return write_clip_weights(*load_clip(source), out, dtype);
  }
  throw std::invalid_argument("export_component: unknown component");
}

}  // namespace flowtrain::trainer
