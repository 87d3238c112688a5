#include "trainer/frozen/frozen_files.h"

#include "trainer/checkpoint/file_util.h"
#include "trainer/frozen/frozen_models.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>

namespace flowtrain::trainer {

namespace fs = std::filesystem;

namespace {

// The files a release folder's model is made of: config.json and its weights (a sharded index and
// every file it maps to).
std::vector<fs::path> model_folder_files(const std::string& folder) {
  std::vector<fs::path> files = {fs::path(folder) / "config.json"};
  const fs::path weights = weights_in_folder(folder);
  files.push_back(weights);
  if (weights.extension() == ".json") {
    std::ifstream in(weights);
    const nlohmann::json index = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.contains("weight_map"))
      throw CheckpointError(fmt::format("{}: not a safetensors index (no weight_map)", weights.string()));
    std::set<std::string> shards;
    for (const auto& [name, file] : index.at("weight_map").items()) shards.insert(file.get<std::string>());
    for (const std::string& shard : shards) files.push_back(fs::path(folder) / shard);
  }
  return files;
}

// A tokenizer is a file (spiece.model, bpe_simple_vocab_16e6.txt.gz) or a folder (vocab.json + merges.txt).
std::vector<fs::path> tokenizer_files(const std::string& path) {
  if (fs::is_directory(path)) return {fs::path(path) / "vocab.json", fs::path(path) / "merges.txt"};
  return {fs::path(path)};
}

FrozenFileRecord record_of(const std::string& path, const std::vector<fs::path>& files) {
  FrozenFileRecord record{path, ""};
  for (const fs::path& file : files) {
    FileDigest digest;
    try {
      digest = digest_file(file.string());
    } catch (const std::exception& e) {
      throw CheckpointError(fmt::format("frozen file {}: {}", file.string(), e.what()));
    }
    // A folder's files by name (config.json, a shard); a single file's name is the user's choice.
    const std::string name = files.size() > 1 ? file.filename().string() + " " : "";
    record.content += fmt::format("{}{}{} {:08x}", record.content.empty() ? "" : " ", name, digest.bytes, digest.crc32);
  }
  return record;
}

}  // namespace

bool has_frozen_files(const ModelConfig& m) {
  return !(m.autoencoder.empty() && m.t5_encoder.empty() && m.t5_tokenizer.empty() && m.clip_encoder.empty() &&
           m.clip_tokenizer.empty());
}

std::map<std::string, FrozenFileRecord> frozen_file_records(const ModelConfig& m) {
  std::map<std::string, FrozenFileRecord> records;
  if (!m.autoencoder.empty()) records["model.autoencoder"] = record_of(m.autoencoder, {fs::path(m.autoencoder)});
  if (!m.t5_encoder.empty()) records["model.text_encoders.t5"] = record_of(m.t5_encoder, model_folder_files(m.t5_encoder));
  if (!m.t5_tokenizer.empty())
    records["model.text_encoders.t5_tokenizer"] = record_of(m.t5_tokenizer, tokenizer_files(m.t5_tokenizer));
  if (!m.clip_encoder.empty())
    records["model.text_encoders.clip"] = record_of(m.clip_encoder, model_folder_files(m.clip_encoder));
  if (!m.clip_tokenizer.empty())
    records["model.text_encoders.clip_tokenizer"] = record_of(m.clip_tokenizer, tokenizer_files(m.clip_tokenizer));
  return records;
}

void check_same_frozen_files(const std::map<std::string, FrozenFileRecord>& recorded,
                             const std::map<std::string, FrozenFileRecord>& current, const std::string& checkpoint_dir) {
  std::set<std::string> keys;
  for (const auto& [key, record] : recorded) keys.insert(key);
  for (const auto& [key, record] : current) keys.insert(key);
  for (const std::string& key : keys) {
    const auto was = recorded.find(key), now = current.find(key);
    const std::string then = was == recorded.end() ? "none" : fmt::format("{} ({})", was->second.path, was->second.content);
    const std::string here = now == current.end() ? "none" : fmt::format("{} ({})", now->second.path, now->second.content);
    if (was == recorded.end() || now == current.end() || was->second.content != now->second.content)
      throw CheckpointError(fmt::format(
          "{} was trained with '{}' {} but this run's config names {}: resume with the same files, or start a new run "
          "from its weights (train.init_from)",
          checkpoint_dir, key, then, here));
  }
}

}  // namespace flowtrain::trainer
