// How an FSDP-sharded state maps onto per-parameter tensors: the units of parallel/fsdp.h as the
// checkpoint manifest records them, and the two conversions a checkpoint needs —
// consolidating every shard into named full tensors (export, eval, resuming at another world
// size) and cutting named full tensors into one rank's shards.
#pragma once

#include "parallel/fsdp.h"
#include "trainer/checkpoint/state_dict.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace flowtrain::trainer {

struct ShardLayout {
  int64_t num_shards = 1;
  std::vector<parallel::FsdpUnitLayout> units;
  std::vector<std::string> order;  // every parameter name in the model's registration order

  nlohmann::json to_json() const;
  // Throws CheckpointError naming `source` on a malformed record.
  static ShardLayout from_json(const nlohmann::json& j, const std::string& source);
};

// shards[k] holds shard k's tensors keyed "<prefix><unit name>"; `fixed` holds the unsharded
// parameters. Returns "<prefix><param name>" → full tensor, in `order` (fixed ones included
// only when prefix is empty, i.e. for weights, not optimizer moments).
NamedTensors consolidate_shards(const ShardLayout& layout, const std::vector<NamedTensors>& shards,
                                const NamedTensors& fixed, const std::string& prefix, const std::string& source);

// The inverse for one shard: "<prefix><unit name>" → shard `index` of the unit's flat buffer,
// taken from "<prefix><param name>" full tensors. Throws CheckpointError on a missing/mis-shaped one.
NamedTensors cut_shard(const ShardLayout& layout, const NamedTensors& full, const std::string& prefix,
                       int64_t index, const std::string& source);

}  // namespace flowtrain::trainer
