#include "trainer/checkpoint/inspect.h"

#include "data/safetensors.h"
#include "trainer/checkpoint/checkpoint.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <c10/core/ScalarType.h>

#include <filesystem>
#include <optional>

namespace fs = std::filesystem;
using nlohmann::json;

namespace flowtrain::trainer {

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

data::SafetensorsReader open_header(const fs::path& path) {
  try {
    return data::SafetensorsReader(path.string());
  } catch (const std::exception& e) {
    throw CheckpointError(e.what());
  }
}

// Every tensor of one unsharded file: name, dtype, shape.
std::string tensors_of_file(const fs::path& path) {
  const data::SafetensorsReader reader = open_header(path);
  std::string out;
  for (const auto& key : reader.keys())
    out += fmt::format("    {}  {}  {}\n", key, c10::toString(reader.dtype(key)), shape_text(reader.shape(key)));
  return out;
}

}  // namespace

std::string describe_checkpoint(const std::string& dir) {
  const json manifest = read_checkpoint_manifest(dir);
  const std::string config = manifest.value("config_yaml", "");
  const uint32_t config_crc = static_cast<uint32_t>(
      ::crc32(0L, reinterpret_cast<const Bytef*>(config.data()), static_cast<uInt>(config.size())));
  const json data_ranks = manifest.value("data", json::object()).value("ranks", json::array());
  const json loader = data_ranks.empty() ? json::object() : data_ranks[0].value("state", json::object());
  const json layout = manifest.value("layout", json::object());

  std::string out = fmt::format("checkpoint {}\n", dir);
  out += fmt::format("  step {}, samples seen {}, lr {:.4g}, optimizer steps {}; data loader at epoch {}, position {}\n",
                     manifest.value("step", int64_t{-1}), manifest.value("samples_seen", int64_t{-1}),
                     manifest.value("lr", 0.0),
                     manifest.value("optimizer", json::object()).value("step_count", int64_t{-1}),
                     loader.value("epoch", int64_t{-1}), loader.value("position", int64_t{-1}));
  out += fmt::format("  written by flowtrain {}; config CRC-32 {:08x} ({} bytes of resolved YAML)\n",
                     manifest.value("flowtrain_version", "?"), config_crc, config.size());
  const bool sharded = layout.value("sharding", "none") == "fsdp";
  std::optional<ShardLayout> shards;
  if (sharded) shards = ShardLayout::from_json(layout.value("fsdp", json::object()), dir + "/manifest.json");
  out += sharded ? fmt::format("  saved at world size {}: FSDP, {} shards of {} units\n", layout.value("world_size", 1),
                               shards->num_shards, shards->units.size())
                 : fmt::format("  saved at world size {}: unsharded\n", layout.value("world_size", 1));

  const json files = manifest.value("files", json::object());
  uint64_t total = 0;
  for (const auto& [name, info] : files.items()) total += info.value("bytes", uint64_t{0});
  out += fmt::format("  files ({}, {:.2f} MiB; sizes and CRC-32 as the manifest records them):\n", files.size(),
                     double(total) / 1048576.0);
  for (const auto& [name, info] : files.items())
    out += fmt::format("    {}  {} bytes  crc32 {:08x}  rank {}\n", name, info.value("bytes", uint64_t{0}),
                       info.value("crc32", uint32_t{0}), info.value("rank", int64_t{0}));

  if (sharded) {
    // Global shapes come from the layout; each unit's flat buffer is cut into equal shards.
    int64_t params = 0;
    for (const auto& unit : shards->units)
      for (const auto& p : unit.params) params += p.numel;
    out += fmt::format("  sharded parameters ({} elements), global shapes:\n", params);
    for (const auto& unit : shards->units)
      for (const auto& p : unit.params)
        out += fmt::format("    {}  {}  unit {} (shard {} elements of {})\n", p.name, shape_text(p.shape), unit.name,
                           unit.shard_numel, unit.padded_numel);
    if (files.contains("fixed.safetensors"))
      out += "  unsharded parameters (fixed.safetensors):\n" + tensors_of_file(fs::path(dir) / "fixed.safetensors");
    out += "  ema and optimizer shards hold the same units (optimizer: exp_avg.<unit>, exp_avg_sq.<unit>)\n";
  } else {
    for (const char* kind : {"model", "ema", "optimizer"}) {
      const std::string file = std::string(kind) + ".safetensors";
      if (!files.contains(file)) continue;
      const data::SafetensorsReader reader = open_header(fs::path(dir) / file);
      int64_t elements = 0;
      for (const auto& key : reader.keys()) elements += numel(reader.shape(key));
      out += fmt::format("  {} ({} tensors, {} elements):\n", file, reader.keys().size(), elements);
      if (std::string(kind) == "model") out += tensors_of_file(fs::path(dir) / file);
    }
  }
  return out;
}

}  // namespace flowtrain::trainer
