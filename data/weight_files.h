// A model's weights as one set of named tensors, whichever way they are stored: one
// .safetensors file, or a Hugging Face sharded checkpoint — `model.safetensors.index.json`, whose
// "weight_map" names the shard file (beside the index) of every tensor, as T5-XXL ships.
#pragma once

#include "data/data_error.h"
#include "data/safetensors.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace flowtrain::data {

class WeightFiles {
 public:
  // A path ending in .json is an index; anything else one safetensors file. Throws DataError
  // naming the file (and key) when the index is malformed, a shard is missing or unreadable, or a
  // tensor the index maps to a shard is not in it.
  explicit WeightFiles(const std::string& path);

  const std::vector<std::string>& keys() const;  // every tensor's name, in file order (shard by shard)
  bool contains(const std::string& key) const;
  std::vector<int64_t> shape(const std::string& key) const;
  at::Tensor get(const std::string& key) const;
  const std::string& path() const { return path_; }
  // The file's __metadata__ (one .safetensors file); empty for a sharded index.
  const std::map<std::string, std::string>& metadata() const;

 private:
  const SafetensorsReader& reader_of(const std::string& key) const;

  std::string path_;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, const SafetensorsReader*> owner_;
  std::vector<std::string> keys_;
};

}  // namespace flowtrain::data
