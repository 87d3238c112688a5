// Sample counts per shard, which the stream plan needs before reading anything. `flowtrain data
// pack` writes them next to the shards as index.json:
//   {"format": "flowtrain-shard-index-1",
//    "shards": [{"name": "train-000000.tar", "samples": 1000, "bytes": 1234567}, …]}
// (names are base names, matched against each entry's base name). A run reads data.shard_index
// (a path, URL or pipe: entry), else the index.json beside each local shard; a shard the index does not
// name is counted by reading its headers (local files: seeks; remote ones: a full download,
// which the log warns about).
#pragma once

#include "data/shards/byte_stream.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace flowtrain::data {

struct ShardIndexEntry {
  std::string name;
  int64_t samples = 0;
  uint64_t bytes = 0;
};

// Writes DIR/index.json atomically (tmp + rename). Throws DataError naming the file.
void write_shard_index(const std::string& dir, const std::vector<ShardIndexEntry>& shards);
// name -> samples. Throws DataError naming the entry when it cannot be read or parsed.
std::map<std::string, int64_t> read_shard_index(const std::string& entry, const FetchOptions& options = {});

// The sample count of every shard (same order). `index_entry` "" looks for index.json in each
// local shard's own directory. Counting of unindexed shards runs on `threads` threads; `counted`
// (optional) receives how many shards had to be counted.
std::vector<int64_t> shard_sample_counts(const std::vector<std::string>& shards, const std::string& index_entry,
                                         int threads, const FetchOptions& options = {}, int64_t* counted = nullptr);

}  // namespace flowtrain::data
