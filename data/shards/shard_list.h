// The shard entries of a run: data.shards (brace patterns) and/or data.shard_list (a file, one
// entry a line; blank lines and lines starting with # ignored), expanded in order; an object-store
// entry with a wildcard (s3://bucket/dir/train-*.tar) is listed (data/shards/s3.h, sorted). Errors before
// training starts, each one DataError naming the key or file: no entries at all, an empty
// pattern, a pattern or list naming a local file that does not exist, or a repeated entry.
#pragma once

#include <string>
#include <vector>

namespace flowtrain::data {

std::vector<std::string> resolve_shard_list(const std::vector<std::string>& patterns, const std::string& list_file);

// The last path component of an entry (URL query strings dropped): how an index names a shard.
std::string shard_basename(const std::string& entry);

}  // namespace flowtrain::data
