#include "trainer/checkpoint/shard_layout.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>

using nlohmann::json;

namespace flowtrain::trainer {

json ShardLayout::to_json() const {
  json units_json = json::array();
  for (const auto& u : units) {
    json params = json::array();
    for (const auto& p : u.params) params.push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}});
    units_json.push_back({{"name", u.name},
                          {"numel", u.numel},
                          {"padded_numel", u.padded_numel},
                          {"shard_numel", u.shard_numel},
                          {"params", params}});
  }
  return {{"num_shards", num_shards}, {"units", units_json}, {"order", order}};
}

ShardLayout ShardLayout::from_json(const json& j, const std::string& source) {
  try {
    ShardLayout l;
    l.num_shards = j.at("num_shards").get<int64_t>();
    l.order = j.at("order").get<std::vector<std::string>>();
    for (const auto& uj : j.at("units")) {
      parallel::FsdpUnitLayout u;
      u.name = uj.at("name").get<std::string>();
      u.numel = uj.at("numel").get<int64_t>();
      u.padded_numel = uj.at("padded_numel").get<int64_t>();
      u.shard_numel = uj.at("shard_numel").get<int64_t>();
      for (const auto& pj : uj.at("params")) {
        parallel::FsdpParamLayout p;
        p.name = pj.at("name").get<std::string>();
        p.shape = pj.at("shape").get<std::vector<int64_t>>();
        p.offset = pj.at("offset").get<int64_t>();
        p.numel = 1;
        for (int64_t d : p.shape) p.numel *= d;
        if (p.offset < 0 || p.offset + p.numel > u.numel)
          throw CheckpointError(fmt::format("{}: layout of '{}' runs past its unit '{}'", source, p.name, u.name));
        u.params.push_back(p);
      }
      if (u.shard_numel * l.num_shards != u.padded_numel || u.padded_numel < u.numel)
        throw CheckpointError(fmt::format("{}: unit '{}' sizes do not add up", source, u.name));
      l.units.push_back(u);
    }
    return l;
  } catch (const json::exception& e) {
    throw CheckpointError(fmt::format("{}: malformed sharding layout: {}", source, e.what()));
  }
}

namespace {
const at::Tensor& find_tensor(const NamedTensors& tensors, const std::string& name, const std::string& source) {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  throw CheckpointError(fmt::format("{}: missing tensor '{}'", source, name));
}
}  // namespace

NamedTensors consolidate_shards(const ShardLayout& layout, const std::vector<NamedTensors>& shards,
                                const NamedTensors& fixed, const std::string& prefix, const std::string& source) {
  if (static_cast<int64_t>(shards.size()) != layout.num_shards)
    throw CheckpointError(fmt::format("{}: {} shards found, the layout has {}", source, shards.size(), layout.num_shards));
  std::map<std::string, at::Tensor> by_name;
  for (const auto& u : layout.units) {
    std::vector<at::Tensor> pieces;
    for (size_t k = 0; k < shards.size(); ++k) {
      const at::Tensor& piece = find_tensor(shards[k], prefix + u.name, fmt::format("{} (shard {})", source, k));
      if (piece.numel() != u.shard_numel)
        throw CheckpointError(fmt::format("{}: shard {} of '{}{}' has {} elements, the layout says {}", source, k,
                                          prefix, u.name, piece.numel(), u.shard_numel));
      pieces.push_back(piece.reshape(-1));
    }
    at::Tensor flat = at::cat(pieces);
    for (const auto& p : u.params) by_name[p.name] = flat.narrow(0, p.offset, p.numel).view(p.shape).clone();
  }
  NamedTensors out;
  for (const auto& name : layout.order) {
    auto it = by_name.find(name);
    if (it != by_name.end()) {
      out.emplace_back(prefix + name, it->second);
    } else if (prefix.empty()) {
      out.emplace_back(name, find_tensor(fixed, name, source));
    }
  }
  return out;
}

NamedTensors cut_shard(const ShardLayout& layout, const NamedTensors& full, const std::string& prefix, int64_t index,
                       const std::string& source) {
  NamedTensors out;
  for (const auto& u : layout.units) {
    at::Tensor flat = at::zeros({u.padded_numel}, at::TensorOptions().dtype(at::kFloat));
    for (const auto& p : u.params) {
      const at::Tensor& t = find_tensor(full, prefix + p.name, source);
      if (t.sizes().vec() != p.shape)
        throw CheckpointError(fmt::format("{}: '{}{}' has shape [{}], the model needs [{}]", source, prefix, p.name,
                                          fmt::join(t.sizes().vec(), ", "), fmt::join(p.shape, ", ")));
      flat.narrow(0, p.offset, p.numel).copy_(t.reshape(-1));
    }
    out.emplace_back(prefix + u.name, flat.narrow(0, index * u.shard_numel, u.shard_numel).clone());
  }
  return out;
}

}  // namespace flowtrain::trainer
