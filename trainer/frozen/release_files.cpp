#include "trainer/frozen/release_files.h"

#include "data/safetensors.h"
#include "trainer/checkpoint/state_dict.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

namespace flowtrain::trainer {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> write_weights(NamedTensors tensors, const std::string& path, at::ScalarType dtype,
                                       const std::map<std::string, std::string>& metadata) {
  std::vector<std::string> names;
  for (auto& [name, tensor] : tensors) {
    tensor = tensor.to(dtype);
    names.push_back(name);
  }
  data::write_safetensors(path, tensors, metadata);
  return names;
}

void write_json(const fs::path& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace

std::vector<std::string> write_autoencoder_file(const models::AutoencoderImpl& ae, const std::string& path,
                                                at::ScalarType dtype) {
  const models::AutoencoderOptions& o = ae.options;
  std::string ch_mult;
  for (const int64_t m : o.ch_mult) ch_mult += (ch_mult.empty() ? "" : ",") + std::to_string(m);
  return write_weights(state_dict(ae), path, dtype,
                       {{"ch", std::to_string(o.ch)}, {"ch_mult", ch_mult},
                        {"num_res_blocks", std::to_string(o.num_res_blocks)},
                        {"z_channels", std::to_string(o.z_channels)}, {"norm_groups", std::to_string(o.norm_groups)},
                        {"scale_factor", fmt::format("{}", o.scale_factor)},
                        {"shift_factor", fmt::format("{}", o.shift_factor)}});
}

// {"format": "pt"}: what transformers' loader expects of a save_pretrained file.
std::vector<std::string> write_t5_weights(const models::T5EncoderImpl& t5, const std::string& path,
                                          at::ScalarType dtype) {
  return write_weights(state_dict(t5), path, dtype, {{"format", "pt"}});
}

std::vector<std::string> write_clip_weights(const models::ClipTextEncoderImpl& clip, const std::string& path,
                                            at::ScalarType dtype) {
  return write_weights(state_dict(clip), path, dtype, {{"format", "pt"}});
}

void write_t5_folder(const models::T5EncoderImpl& t5, const std::string& folder, at::ScalarType dtype) {
  fs::create_directories(folder);
  const models::T5Options& o = t5.options;
  write_t5_weights(t5, (fs::path(folder) / "model.safetensors").string(), dtype);
  write_json(fs::path(folder) / "config.json",
             {{"architectures", {"T5EncoderModel"}}, {"vocab_size", o.vocab_size}, {"d_model", o.d_model},
              {"d_kv", o.d_kv}, {"d_ff", o.d_ff}, {"num_layers", o.num_layers}, {"num_heads", o.num_heads},
              {"feed_forward_proj", "gated-gelu"}, {"layer_norm_epsilon", o.layer_norm_eps},
              {"relative_attention_num_buckets", o.relative_attention_num_buckets},
              {"relative_attention_max_distance", o.relative_attention_max_distance}});
}

void write_clip_folder(const models::ClipTextEncoderImpl& clip, const std::string& folder, at::ScalarType dtype) {
  fs::create_directories(folder);
  const models::ClipTextOptions& o = clip.options;
  write_clip_weights(clip, (fs::path(folder) / "model.safetensors").string(), dtype);
  write_json(fs::path(folder) / "config.json",
             {{"architectures", {"CLIPTextModel"}}, {"vocab_size", o.vocab_size}, {"hidden_size", o.hidden},
              {"intermediate_size", o.intermediate}, {"num_hidden_layers", o.layers},
              {"num_attention_heads", o.heads}, {"max_position_embeddings", o.max_positions},
              {"hidden_act", "quick_gelu"}, {"layer_norm_eps", o.layer_norm_eps}, {"eos_token_id", o.eos_token_id}});
}

}  // namespace flowtrain::trainer
