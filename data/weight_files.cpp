#include "data/weight_files.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>

namespace flowtrain::data {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The index's weight_map: tensor name -> shard file name.
std::map<std::string, std::string> read_weight_map(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw DataError("weights index " + path + ": cannot be read");
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw DataError("weights index " + path + ": not JSON (" + e.what() + ")");
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    throw DataError("weights index " + path + ": no \"weight_map\" object (a Hugging Face *.safetensors.index.json?)");
  std::map<std::string, std::string> map;
  for (const auto& [key, file] : index["weight_map"].items()) {
    if (!file.is_string()) throw DataError("weights index " + path + ": the file of '" + key + "' is not a string");
    const std::string name = file.get<std::string>();
    if (name.empty() || fs::path(name).is_absolute() || name.find("..") != std::string::npos)
      throw DataError("weights index " + path + ": '" + key + "' maps to '" + name + "', not a file beside the index");
    map[key] = name;
  }
  return map;
}

}  // namespace

WeightFiles::WeightFiles(const std::string& path) : path_(path) {
  if (!ends_with(path, ".json")) {
    files_.push_back(std::make_unique<SafetensorsReader>(path));
    for (const auto& key : files_.back()->keys()) owner_[key] = files_.back().get();
    keys_ = files_.back()->keys();
    return;
  }
  const std::map<std::string, std::string> weight_map = read_weight_map(path);
  std::set<std::string> shards;
  for (const auto& [key, file] : weight_map) shards.insert(file);
  for (const auto& shard : shards) {
    const std::string shard_path = (fs::path(path).parent_path() / shard).string();
    if (!fs::exists(shard_path)) throw DataError("weights index " + path + ": shard " + shard_path + " does not exist");
    files_.push_back(std::make_unique<SafetensorsReader>(shard_path));
    const SafetensorsReader& reader = *files_.back();
    for (const auto& key : reader.keys()) {
      const auto it = weight_map.find(key);
      if (it == weight_map.end() || it->second != shard)
        throw DataError("weights index " + path + ": shard " + shard_path + " holds '" + key +
                        "', which the index maps " + (it == weight_map.end() ? "nowhere" : "to " + it->second));
      owner_[key] = &reader;
      keys_.push_back(key);
    }
  }
  for (const auto& [key, file] : weight_map)
    if (!owner_.count(key)) throw DataError("weights index " + path + ": '" + key + "' is not in its shard " + file);
}

const std::vector<std::string>& WeightFiles::keys() const { return keys_; }

const std::map<std::string, std::string>& WeightFiles::metadata() const {
  static const std::map<std::string, std::string> none;
  return ends_with(path_, ".json") ? none : files_.front()->metadata();
}

bool WeightFiles::contains(const std::string& key) const { return owner_.count(key) > 0; }

const SafetensorsReader& WeightFiles::reader_of(const std::string& key) const {
  const auto it = owner_.find(key);
  if (it == owner_.end()) throw DataError("weights " + path_ + ": no tensor named '" + key + "'");
  return *it->second;
}

std::vector<int64_t> WeightFiles::shape(const std::string& key) const { return reader_of(key).shape(key); }

at::Tensor WeightFiles::get(const std::string& key) const { return reader_of(key).get(key); }

}  // namespace flowtrain::data
